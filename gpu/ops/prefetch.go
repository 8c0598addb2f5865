package ops

import (
	"context"

	"github.com/rdrr/peer/gpu"
)

// prefetchThreads is how many threads a Prefetch spreads over at most:
// enough that each asks for 8 sectors of a product's weights (a Mixtral
// layer's q k v, 14 MB), few enough to leave the dispatch it runs beside
// room.
const prefetchThreads = 64 << 10

// prefetchKey is what a Prefetch thread's words must xor to for it to
// write the sink: any value would do; the write's condition is what keeps
// the loads.
const prefetchKey = 0x9e3779b9

// PrefetchLaunch is the dispatch rule of Prefetch over n bytes (a
// positive multiple of 4). Bindings: region, sink.
func PrefetchLaunch(n uint64) (Launch, error) {
	const name = "prefetch"
	if n == 0 || n%4 != 0 || n/4 > 1<<31 {
		return Launch{}, shapeErr(name, "%d bytes (a positive multiple of 4, at most 8 GiB)", n)
	}
	sectors := ceilDiv(n, 32)
	threads := min(sectors, prefetchThreads)
	gx := ceilDiv(threads, 256)
	per := ceilDiv(ceilDiv(sectors, gx*256), 8) * 8
	return Launch{Kernel: name, Groups: [3]uint32{uint32(gx), 1, 1},
		Params:   gpu.Params{}.U32(uint32(n / 4)).U32(uint32(per)).U32(prefetchKey).U32(0),
		Bindings: []Binding{{"region", n}, {"sink", 4}}}, nil
}

// Prefetch records a read of every 32-byte sector of region, so that a
// later dispatch finds it in the L2 cache. Its output is of no use: a
// thread whose words xor to prefetchKey writes that to sink, which is
// bound so that the loads have an effect the compiler must keep. Recorded right after a dispatch that
// leaves the GPU mostly idle and binds nothing in common with it except
// read-only, it runs beside that dispatch; the barrier before the next
// dependent dispatch waits for both. Give each Prefetch of a batch its
// own sink buffer: two dispatches that write one buffer have a barrier
// between them.
func (k *Kernels) Prefetch(ctx context.Context, b *gpu.Batch, region, sink gpu.Region) error {
	l, err := PrefetchLaunch(gpu.SpanOf(region).Size())
	return k.launch(ctx, b, l, err, region, sink)
}
