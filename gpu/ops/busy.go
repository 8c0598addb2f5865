package ops

import (
	"context"
	"time"

	"github.com/rdrr/peer/gpu"
)

// busyBytes is the size of each of Busy's two buffers, and busyCopies the
// copies of it one of its submissions records: 512 MiB read and 512
// written, on the H200 ~0.6 ms at its full clocks (a second of Busy ran
// 55616 copies, 1738 submissions) and several at its idle ones.
const (
	busyBytes  = 16 << 20
	busyCopies = 32
)

// Busy keeps the GPU's shaders busy for about d, copying between two
// buffers of its own (compute-shader copies, submitted one batch at a
// time and waited for), and returns how many copies ran. A GPU that sat
// idle runs at low clocks until its work has kept it busy a while: on
// the H200 the decode step's first ~200 ms ran at 375 MHz, 4x slower,
// after a warm-up that read experts from disk with the GPU idle
// (experts/BENCHMARKS.md, 2026-11-29). Busy before a timed run makes it
// start at the clocks it will hold. It stops early when ctx is done.
func (k *Kernels) Busy(ctx context.Context, d time.Duration) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var bufs [2]*gpu.Buffer
	for i := range bufs {
		b, err := k.d.Alloc(busyBytes)
		if err != nil {
			return 0, err
		}
		defer b.Release()
		bufs[i] = b
	}
	n := 0
	for start := time.Now(); time.Since(start) < d; {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		b := k.d.Batch()
		for i := range busyCopies {
			k.CopyKernel(ctx, b, bufs[i%2], bufs[1-i%2], busyBytes) // an error is the batch's: Submit returns it
		}
		if err := b.Submit(ctx); err != nil {
			return n, err
		}
		if err := k.d.Sync(ctx); err != nil {
			return n, err
		}
		n += busyCopies
	}
	return n, nil
}
