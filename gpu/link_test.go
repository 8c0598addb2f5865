package gpu_test

import (
	"context"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
)

// Links the op library into package gpu's tests (see ops_hook_test.go).
func init() {
	gpu.NewKernels = func(d *gpu.Device) gpu.OpKernels { return opKernels{ops.NewKernels(d)} }
	gpu.Builtin = ops.Builtin
}

// opKernels adapts ops.Kernels to gpu.OpKernels.
type opKernels struct{ *ops.Kernels }

func (k opKernels) Accumulate(ctx context.Context, b *gpu.Batch, src, w, dst gpu.Region, experts, dim, wOff int) error {
	return k.Kernels.Accumulate(ctx, b, src, w, dst, ops.AccumShape{Experts: experts, Dim: dim, WeightOff: wOff})
}

func (k opKernels) Q4KMatVecGroup(ctx context.Context, b *gpu.Batch, arena gpu.Region, slots []int, x gpu.Region, sharedX bool, y gpu.Region, rows, cols int) error {
	return k.Kernels.Q4KMatVecGroup(ctx, b, ops.Group{Arena: arena, Slots: slots, X: x, SharedX: sharedX, Y: y, Rows: rows, Cols: cols})
}
