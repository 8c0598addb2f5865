package gpu

import (
	"context"

	"github.com/rdrr/peer/gpu/abi"
)

// The runtime's tests and benchmarks load the GPU with real kernels, from
// the op library (gpu/ops). gpu/ops imports gpu, so a test inside gpu
// cannot import it: the external test package links it in (link_test.go)
// before TestMain runs, through the variables below.

// OpKernels is what these tests use of gpu/ops.Kernels, in the positional
// forms they were written with (link_test.go turns them into the op
// library's shape structs).
type OpKernels interface {
	SwiGLU(ctx context.Context, b *Batch, gate, up, y Region, n int) error
	Accumulate(ctx context.Context, b *Batch, src, w, dst Region, experts, dim, wOff int) error
	CopyKernel(ctx context.Context, b *Batch, src, dst Region, n int) error
	Q4KMatVecGroup(ctx context.Context, b *Batch, arena Region, slots []int, x Region, sharedX bool, y Region, rows, cols int) error
	Close()
}

var (
	// NewKernels is gpu/ops.NewKernels.
	NewKernels func(d *Device) OpKernels
	// Builtin is gpu/ops.Builtin.
	Builtin func(name string, constants map[string]float64) (Kernel, error)
)

// Q4K is the Q4_K element type, for sizes (Q4K.Bytes).
const Q4K = abi.Q4K
