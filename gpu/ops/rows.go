package ops

import (
	"context"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// The row-wise and element-wise ops: RMSNorm, softmax, SwiGLU, the
// weighted accumulate of expert outputs, embedding lookup and the shader
// copy.

// RowsShape is Rows rows of Dim values.
type RowsShape struct {
	Rows, Dim int
}

// NormShape is an RMSNorm over Rows rows of Dim values with epsilon Eps.
type NormShape struct {
	Rows, Dim int
	Eps       float32
}

// RMSNormLaunch is the dispatch rule of RMSNorm: one workgroup a row.
// Bindings: x, w, y.
func RMSNormLaunch(s NormShape) (Launch, error) {
	const name = "rmsnorm"
	n, d := s.Rows, s.Dim
	if n <= 0 || d <= 0 {
		return Launch{}, shapeErr(name, "%d rows of %d", n, d)
	}
	gx, gy := grid(uint64(n))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1},
		Params:   gpu.Params{}.U32(uint32(n)).U32(uint32(d)).F32(s.Eps).U32(gx),
		Bindings: []Binding{{"x", uint64(n * d * 4)}, {"w", uint64(d * 4)}, {"y", uint64(n * d * 4)}}}, nil
}

// RMSNorm records y = x / sqrt(mean(x^2) + eps) * w over s.Rows rows.
// y must be another buffer than x and w (see gpu.Batch.Dispatch).
func (k *Kernels) RMSNorm(ctx context.Context, b *gpu.Batch, x, w, y gpu.Region, s NormShape) error {
	l, err := RMSNormLaunch(s)
	return k.launch(ctx, b, l, err, x, w, y)
}

// SoftmaxLaunch is the dispatch rule of Softmax: one workgroup a row.
// Bindings: x, y.
func SoftmaxLaunch(s RowsShape) (Launch, error) {
	const name = "softmax"
	n, d := s.Rows, s.Dim
	if n <= 0 || d <= 0 {
		return Launch{}, shapeErr(name, "%d rows of %d", n, d)
	}
	gx, gy := grid(uint64(n))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1}, Params: gpu.Params{}.U32(uint32(n)).U32(uint32(d)).U32(gx),
		Bindings: []Binding{{"x", uint64(n * d * 4)}, {"y", uint64(n * d * 4)}}}, nil
}

// Softmax records y = softmax(x) over each row, y another buffer than x.
func (k *Kernels) Softmax(ctx context.Context, b *gpu.Batch, x, y gpu.Region, s RowsShape) error {
	l, err := SoftmaxLaunch(s)
	return k.launch(ctx, b, l, err, x, y)
}

// SwiGLULaunch is the dispatch rule of SwiGLU over n elements. Bindings:
// gate, up, y.
func SwiGLULaunch(n int) (Launch, error) {
	const name = "swiglu"
	if n <= 0 {
		return Launch{}, shapeErr(name, "%d elements", n)
	}
	gx, gy := grid(ceilDiv(uint64(n), 256))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1}, Params: gpu.Params{}.U32(uint32(n)).U32(gx),
		Bindings: []Binding{{"gate", uint64(n * 4)}, {"up", uint64(n * 4)}, {"y", uint64(n * 4)}}}, nil
}

// SwiGLU records y = silu(gate) * up over n elements, y another buffer.
func (k *Kernels) SwiGLU(ctx context.Context, b *gpu.Batch, gate, up, y gpu.Region, n int) error {
	l, err := SwiGLULaunch(n)
	return k.launch(ctx, b, l, err, gate, up, y)
}

// AccumShape is the weighted sum of Experts expert outputs of Dim values
// into a residual stream, their weights from WeightOff on in the weights
// buffer (straight from Route: the token's row of its output).
type AccumShape struct {
	Experts, Dim, WeightOff int
}

// AccumulateLaunch is the dispatch rule of Accumulate. Bindings: src,
// weights, dst (read and written).
func AccumulateLaunch(s AccumShape) (Launch, error) {
	const name = "accumulate"
	kExp, d, wOff := s.Experts, s.Dim, s.WeightOff
	if kExp <= 0 || d <= 0 || wOff < 0 {
		return Launch{}, shapeErr(name, "k %d, d %d, weight offset %d", kExp, d, wOff)
	}
	gx, gy := grid(ceilDiv(uint64(d), 256))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1},
		Params:   gpu.Params{}.U32(uint32(d)).U32(uint32(kExp)).U32(uint32(wOff)).U32(gx),
		Bindings: []Binding{{"src", uint64(kExp * d * 4)}, {"weights", uint64((wOff + kExp) * 4)}, {"dst", uint64(d * 4)}}}, nil
}

// Accumulate records dst[i] += sum_j w[WeightOff+j] * src[j*Dim+i] for j <
// Experts: the weighted sum of the expert outputs (src [Experts][Dim]).
func (k *Kernels) Accumulate(ctx context.Context, b *gpu.Batch, src, w, dst gpu.Region, s AccumShape) error {
	l, err := AccumulateLaunch(s)
	return k.launch(ctx, b, l, err, src, w, dst)
}

// AccumParts is how many partial sums AccumulateNorm writes for a
// vector of dim: one per workgroup of 256.
func AccumParts(dim int) int { return int(ceilDiv(uint64(dim), 256)) }

// AccumulateNormLaunch is the dispatch rule of AccumulateNorm:
// accumulate_norm; Experts may be 0. Bindings: src, weights, dst, norm
// weight, x * g, partial sums.
func AccumulateNormLaunch(s AccumShape) (Launch, error) {
	const name = "accumulate_norm"
	kExp, d, wOff := s.Experts, s.Dim, s.WeightOff
	if kExp < 0 || d <= 0 || wOff < 0 {
		return Launch{}, shapeErr(name, "k %d, d %d, weight offset %d", kExp, d, wOff)
	}
	if err := checkParts(name, d); err != nil {
		return Launch{}, err
	}
	gx, gy := grid(ceilDiv(uint64(d), 256))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1},
		Params: gpu.Params{}.U32(uint32(d)).U32(uint32(kExp)).U32(uint32(wOff)).U32(gx),
		Bindings: []Binding{{"src", uint64(kExp * d * 4)}, {"weights", uint64((wOff + kExp) * 4)}, {"dst", uint64(d * 4)},
			{"norm weight", uint64(d * 4)}, {"x * g", uint64(d * 4)}, {"partial sums", uint64(AccumParts(d) * 4)}}}, nil
}

// AccumulateNorm is Accumulate that also hands the RMSNorm of the new
// dst, with weight g, to the products that read it (see Normed): out.XG
// and out.Parts are written (out.Eps is the products' to use).
func (k *Kernels) AccumulateNorm(ctx context.Context, b *gpu.Batch, src, w, dst, g gpu.Region, out Normed, s AccumShape) error {
	l, err := AccumulateNormLaunch(s)
	return k.launch(ctx, b, l, err, src, w, dst, g, out.XG, out.Parts)
}

// EmbedShape is an embedding lookup of Tokens ids into a table of Vocab
// rows of Dim elements of type Type (Q4K needs Dim % 256 == 0).
type EmbedShape struct {
	Type               abi.DType
	Tokens, Dim, Vocab int
}

// EmbedLaunch is the dispatch rule of Embed. Bindings: table, ids, y.
func EmbedLaunch(s EmbedShape) (Launch, error) {
	const name = "embed"
	dt, n, d, vocab := s.Type, s.Tokens, s.Dim, s.Vocab
	if n <= 0 || d <= 0 || vocab <= 0 || (dt == abi.Q4K && d%256 != 0) || dt < abi.F32 || dt > abi.Q4K {
		return Launch{}, shapeErr(name, "%d tokens, d %d, vocab %d, %v", n, d, vocab, dt)
	}
	gx, gy := grid(ceilDiv(uint64(n*d), 256))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1},
		Params:   gpu.Params{}.U32(uint32(n)).U32(uint32(d)).U32(uint32(dt)).U32(gx),
		Bindings: []Binding{{"table", dt.Bytes(vocab * d)}, {"ids", uint64(n * 4)}, {"y", uint64(n * d * 4)}}}, nil
}

// Embed records y[t] = table[ids[t]] for the s.Tokens token ids (u32).
// Vocab bounds the ids the table holds; ids are not checked on the GPU.
func (k *Kernels) Embed(ctx context.Context, b *gpu.Batch, table, ids, y gpu.Region, s EmbedShape) error {
	l, err := EmbedLaunch(s)
	return k.launch(ctx, b, l, err, table, ids, y)
}

// CopyLaunch is the dispatch rule of CopyKernel. Bindings: src, dst.
func CopyLaunch(n int) (Launch, error) {
	const name = "copy"
	if n <= 0 || n%16 != 0 {
		return Launch{}, shapeErr(name, "%d bytes (want a positive multiple of 16)", n)
	}
	const unroll = 4
	gx, gy := grid(ceilDiv(uint64(n/16), 256*unroll))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1}, Params: gpu.Params{}.U32(uint32(n / 16)).U32(gx),
		Bindings: []Binding{{"src", uint64(n)}, {"dst", uint64(n)}}}, nil
}

// CopyKernel records dst = src with a compute shader (n bytes, a multiple
// of 16). gpu.Batch.Copy uses the copy engine instead; benchmarks measure
// both.
func (k *Kernels) CopyKernel(ctx context.Context, b *gpu.Batch, src, dst gpu.Region, n int) error {
	l, err := CopyLaunch(n)
	return k.launch(ctx, b, l, err, src, dst)
}
