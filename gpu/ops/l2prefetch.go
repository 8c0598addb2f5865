package ops

import (
	"context"

	"github.com/rdrr/peer/gpu"
)

// l2PrefetchThreads is how many threads an L2Prefetch spreads over at
// most, a sector each up to 2 MB (a Mixtral router's 128 KB takes 4096),
// beyond that each a round of eight sectors or more: few enough to leave
// the dispatch it runs beside room.
const l2PrefetchThreads = 64 << 10

// l2PrefetchKey is what an L2Prefetch thread's words must xor to for it to
// write the sink: any value would do; the write's condition is what keeps
// the loads.
const l2PrefetchKey = 0x9e3779b9

// L2PrefetchLaunch is the dispatch rule of L2Prefetch over n bytes (a
// positive multiple of 4). Bindings: region, sink.
func L2PrefetchLaunch(n uint64) (Launch, error) {
	const name = "l2_prefetch"
	if n == 0 || n%4 != 0 || n/4 > 1<<31 {
		return Launch{}, shapeErr(name, "%d bytes (a positive multiple of 4, at most 8 GiB)", n)
	}
	sectors := ceilDiv(n, 32)
	threads := min(sectors, l2PrefetchThreads)
	gx := ceilDiv(threads, 256)
	per := ceilDiv(ceilDiv(sectors, gx*256), 8) * 8
	return Launch{Kernel: name, Groups: [3]uint32{uint32(gx), 1, 1},
		Params:   gpu.Params{}.U32(uint32(n / 4)).U32(uint32(per)).U32(l2PrefetchKey).U32(0),
		Bindings: []Binding{{"region", n}, {"sink", 4}}}, nil
}

// L2Prefetch records a read of every 32-byte sector of region, so that a
// later dispatch finds it in the L2 cache. Its output is of no use: a
// thread whose words xor to l2PrefetchKey writes that to sink, which is
// bound so that the loads have an effect the compiler must keep.
// Recorded right after a dispatch that leaves the GPU mostly idle and
// binds nothing in common with it except read-only, it runs beside that
// dispatch; the barrier before the next dependent dispatch waits for
// both. Give each L2Prefetch of a batch its own sink buffer: two
// dispatches that write one buffer have a barrier between them.
func (k *Kernels) L2Prefetch(ctx context.Context, b *gpu.Batch, region, sink gpu.Region) error {
	l, err := L2PrefetchLaunch(gpu.SpanOf(region).Size())
	return k.launch(ctx, b, l, err, region, sink)
}
