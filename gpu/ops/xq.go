package ops

import (
	"context"

	"github.com/rdrr/peer/gpu"
)

// XQGroup is how many values of x share a scale in the quantized form
// that the _xq products read (QuantizeX).
const XQGroup = 16

// XQBytes is the size of n values of x in quantized form: three 16-byte
// words a group of XQGroup (its values' pairs, its scale and sum).
func XQBytes(n int) uint64 { return uint64(n/XQGroup) * 48 }

// QuantizeXLaunch is the dispatch rule of QuantizeX. Bindings: x, q.
func QuantizeXLaunch(n int) (Launch, error) {
	const name = "quantize_x"
	if n <= 0 || n%XQGroup != 0 {
		return Launch{}, shapeErr(name, "%d values (a positive multiple of %d)", n, XQGroup)
	}
	groups := n / XQGroup
	gx, gy := grid(ceilDiv(uint64(groups), 64))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1}, Params: gpu.Params{}.U32(uint32(groups)).U32(gx),
		Bindings: []Binding{{"x", uint64(n * 4)}, {"q", XQBytes(n)}}}, nil
}

// QuantizeX records q = x quantized for the _xq products (Group.XQ,
// Masked.XQ): each group of XQGroup values becomes integers in [-127,
// 127] times a scale, the group's largest magnitude / 127 (ref.QuantizeX
// gives the values the products then use). n values, x and q other
// buffers or apart.
func (k *Kernels) QuantizeX(ctx context.Context, b *gpu.Batch, x, q gpu.Region, n int) error {
	l, err := QuantizeXLaunch(n)
	return k.launch(ctx, b, l, err, x, q)
}

// RMSNormXQLaunch is the dispatch rule of RMSNormXQ: one workgroup a row.
// Bindings: x, w, y, q.
func RMSNormXQLaunch(s NormShape) (Launch, error) {
	const name = "rmsnorm_xq"
	n, d := s.Rows, s.Dim
	if n <= 0 || d <= 0 || d%XQGroup != 0 {
		return Launch{}, shapeErr(name, "%d rows of %d (a positive multiple of %d)", n, d, XQGroup)
	}
	gx, gy := grid(uint64(n))
	return Launch{Kernel: name, Constants: map[string]float64{"DIM": float64(d)}, Groups: [3]uint32{gx, gy, 1},
		Params:   gpu.Params{}.U32(uint32(n)).U32(uint32(d)).F32(s.Eps).U32(gx),
		Bindings: []Binding{{"x", uint64(n * d * 4)}, {"w", uint64(d * 4)}, {"y", uint64(n * d * 4)}, {"q", uint64(n) * XQBytes(d)}}}, nil
}

// RMSNormXQ records RMSNorm's y and, in the same dispatch, y quantized
// into q (QuantizeX's form): the norm that feeds both a float product
// (an MoE router) and quantized ones (its experts) in one dispatch.
func (k *Kernels) RMSNormXQ(ctx context.Context, b *gpu.Batch, x, w, y, q gpu.Region, s NormShape) error {
	l, err := RMSNormXQLaunch(s)
	return k.launch(ctx, b, l, err, x, w, y, q)
}

// MaxAccumNormExperts bounds the vectors AccumulateRMSNormXQ adds.
const MaxAccumNormExperts = 16

// AccumulateRMSNormXQLaunch is the dispatch rule of AccumulateRMSNormXQ:
// one workgroup, one row. Bindings: src, weights, x (read and written),
// norm weight, y, q.
func AccumulateRMSNormXQLaunch(a AccumShape, eps float32) (Launch, error) {
	const name = "accumulate_rmsnorm_xq"
	k, d, wOff := a.Experts, a.Dim, a.WeightOff
	if k <= 0 || k > MaxAccumNormExperts || d <= 0 || d%XQGroup != 0 || wOff < 0 {
		return Launch{}, shapeErr(name, "k %d (1..16), d %d (a positive multiple of %d), weight offset %d", k, d, XQGroup, wOff)
	}
	// The row and the rows added are constants of the pipeline: a model
	// has one or two of each.
	return Launch{Kernel: name, Constants: map[string]float64{"DIM": float64(d), "KADD": float64(k)}, Groups: [3]uint32{1, 1, 1},
		Params: gpu.Params{}.U32(1).U32(uint32(d)).F32(eps).U32(1).U32(uint32(k)).U32(uint32(wOff)),
		Bindings: []Binding{{"src", uint64(k * d * 4)}, {"weights", uint64((wOff + k) * 4)}, {"x", uint64(d * 4)},
			{"norm weight", uint64(d * 4)}, {"y", uint64(d * 4)}, {"q", XQBytes(d)}}}, nil
}

// AccumulateRMSNormXQToLaunch is the dispatch rule of
// AccumulateRMSNormXQTo: AccumulateRMSNormXQLaunch's, kernel
// accumulate_rmsnorm_xq_out, x read only and a seventh binding, x out.
func AccumulateRMSNormXQToLaunch(a AccumShape, eps float32) (Launch, error) {
	l, err := AccumulateRMSNormXQLaunch(a, eps)
	if err != nil {
		return Launch{}, err
	}
	l.Kernel = "accumulate_rmsnorm_xq_out"
	l.Bindings = append(l.Bindings, Binding{"x out", uint64(a.Dim * 4)})
	return l, nil
}

// AccumulateRMSNormXQTo is AccumulateRMSNormXQ with the new x written to
// xo instead of x (the same bits; x is only read): a norm that writes
// nothing the dispatches before it in a command buffer read, so that it
// runs beside them without a barrier.
func (k *Kernels) AccumulateRMSNormXQTo(ctx context.Context, b *gpu.Batch, src, wts, x, w, y, q, xo gpu.Region, a AccumShape, eps float32) error {
	l, err := AccumulateRMSNormXQToLaunch(a, eps)
	return k.launch(ctx, b, l, err, src, wts, x, w, y, q, xo)
}

// AccumulateRMSNormXQ records Accumulate (x += the weighted sum of a.Experts
// vectors of src) and then RMSNormXQ of the new x (y, and y quantized into
// q) in one dispatch: the accumulate after a layer's products and the
// norm after it. One row.
func (k *Kernels) AccumulateRMSNormXQ(ctx context.Context, b *gpu.Batch, src, wts, x, w, y, q gpu.Region, a AccumShape, eps float32) error {
	l, err := AccumulateRMSNormXQLaunch(a, eps)
	return k.launch(ctx, b, l, err, src, wts, x, w, y, q)
}
