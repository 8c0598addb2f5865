// Package ref holds the float64 CPU references of the GPU kernels: the
// ground truth that gpu's differential tests and the kernel lab's
// correctness gate compare against, and the per-op tolerances they use.
//
// Every function takes its inputs as float64 (use F32, F16 and Q4K to widen
// exactly what was uploaded) and computes in float64. Layouts match the
// kernels: row-major, tokens outermost. The enumerations they share with
// the kernels (RoPE styles, routing modes) are gpu/abi's.
package ref

import (
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/x448/float16"
)

// F32 widens float32 values.
func F32(xs []float32) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

// F16 widens f16 bits.
func F16(hs []uint16) []float64 {
	out := make([]float64, len(hs))
	for i, h := range hs {
		out[i] = float64(float16.Frombits(h).Float32())
	}
	return out
}

// Q4K decodes GGML Q4_K blocks (GGML's float32 formula, exactly) and widens
// the weights.
func Q4K(blocks []byte) ([]float64, error) {
	w := make([]float32, len(blocks)/q4k.BlockBytes*q4k.BlockWeights)
	if err := q4k.Dequantize(w, blocks); err != nil {
		return nil, err
	}
	return F32(w), nil
}

// MatMul returns y[t*rows+r] = sum_k w[r*cols+k] * x[t*cols+k] for n tokens,
// and mag[t*rows+r] = sum_k |w[r*cols+k] * x[t*cols+k]|, the scale a
// float32 dot product's rounding error grows with.
func MatMul(w, x []float64, rows, cols, n int) (y, mag []float64) {
	y = make([]float64, n*rows)
	mag = make([]float64, n*rows)
	for t := 0; t < n; t++ {
		xt := x[t*cols : (t+1)*cols]
		for r := 0; r < rows; r++ {
			wr := w[r*cols : (r+1)*cols]
			var s, m float64
			for k, wv := range wr {
				p := wv * xt[k]
				s += p
				m += math.Abs(p)
			}
			y[t*rows+r] = s
			mag[t*rows+r] = m
		}
	}
	return y, mag
}

// Q4KMatMul is MatMul of the Q4_K matrix blocks (rows x cols, cols a
// multiple of 256) and x (n tokens): the weights are decoded as Q4K does,
// one row at a time, so a large matrix is never widened whole.
func Q4KMatMul(blocks []byte, x []float64, rows, cols, n int) (y, mag []float64, err error) {
	rb := q4k.RowBytes(cols)
	if cols <= 0 || cols%q4k.BlockWeights != 0 || rows < 0 || n < 0 || len(blocks) < rows*rb || len(x) < n*cols {
		return nil, nil, fmt.Errorf("ref: Q4KMatMul of %d bytes, %d x values as %dx%d, %d tokens", len(blocks), len(x), rows, cols, n)
	}
	y = make([]float64, n*rows)
	mag = make([]float64, n*rows)
	w := make([]float32, cols)
	for r := range rows {
		if err := q4k.Dequantize(w, blocks[r*rb:(r+1)*rb]); err != nil {
			return nil, nil, err
		}
		for t := range n {
			xt := x[t*cols : (t+1)*cols]
			var s, m float64
			for k, wv := range w {
				p := float64(wv) * xt[k]
				s += p
				m += math.Abs(p)
			}
			y[t*rows+r] = s
			mag[t*rows+r] = m
		}
	}
	return y, mag, nil
}

// RMSNorm returns y = x / sqrt(mean(x^2) + eps) * w per row of d.
func RMSNorm(x, w []float64, n, d int, eps float64) []float64 {
	y := make([]float64, n*d)
	for r := 0; r < n; r++ {
		xr := x[r*d : (r+1)*d]
		var ss float64
		for _, v := range xr {
			ss += v * v
		}
		inv := 1 / math.Sqrt(ss/float64(d)+eps)
		for i, v := range xr {
			y[r*d+i] = v * inv * w[i]
		}
	}
	return y
}

// Softmax returns the softmax of each row of d.
func Softmax(x []float64, n, d int) []float64 {
	y := make([]float64, n*d)
	for r := 0; r < n; r++ {
		xr := x[r*d : (r+1)*d]
		m := math.Inf(-1)
		for _, v := range xr {
			m = math.Max(m, v)
		}
		var s float64
		for i, v := range xr {
			e := math.Exp(v - m)
			y[r*d+i] = e
			s += e
		}
		for i := range xr {
			y[r*d+i] /= s
		}
	}
	return y
}

// RopeFreqs returns the rot/2 inverse frequencies theta^(-2i/rot).
func RopeFreqs(theta float64, rot int) []float64 {
	f := make([]float64, rot/2)
	for i := range f {
		f[i] = math.Pow(theta, -2*float64(i)/float64(rot))
	}
	return f
}

// Rope rotates the first rot elements of every head of x
// ([nTok][nHeads][headDim]) by angle (pos0+t)*freqs[i].
func Rope(x []float64, nTok, nHeads, headDim, rot, pos0 int, freqs []float64, style abi.RopeStyle) []float64 {
	y := append([]float64(nil), x...)
	half := rot / 2
	for t := 0; t < nTok; t++ {
		pos := float64(pos0 + t)
		for h := 0; h < nHeads; h++ {
			base := (t*nHeads + h) * headDim
			for i := 0; i < half; i++ {
				ia, ib := base+i, base+i+half
				if style == abi.RopeGPTJ {
					ia, ib = base+2*i, base+2*i+1
				}
				s, c := math.Sincos(pos * freqs[i])
				a, b := x[ia], x[ib]
				y[ia] = a*c - b*s
				y[ib] = a*s + b*c
			}
		}
	}
	return y
}

// Attention is decode attention of one query token over kvLen cached
// positions with grouped-query heads: q [nHeads][hd], k and v
// [kvLen][nKV][hd]; head h reads kv head h/(nHeads/nKV).
func Attention(q, k, v []float64, nHeads, nKV, hd, kvLen int, scale float64) []float64 {
	out := make([]float64, nHeads*hd)
	group := nHeads / nKV
	s := make([]float64, kvLen)
	for h := 0; h < nHeads; h++ {
		kvh := h / group
		qh := q[h*hd : (h+1)*hd]
		m := math.Inf(-1)
		for t := 0; t < kvLen; t++ {
			kt := k[(t*nKV+kvh)*hd:]
			var dot float64
			for i := 0; i < hd; i++ {
				dot += qh[i] * kt[i]
			}
			s[t] = dot * scale
			m = math.Max(m, s[t])
		}
		var sum float64
		for t := range s {
			s[t] = math.Exp(s[t] - m)
			sum += s[t]
		}
		for t := 0; t < kvLen; t++ {
			vt := v[(t*nKV+kvh)*hd:]
			p := s[t] / sum
			for i := 0; i < hd; i++ {
				out[h*hd+i] += p * vt[i]
			}
		}
	}
	return out
}

// Route configures top-k routing.
type Route struct {
	Mode      abi.RouteMode
	K         int
	Bias      []float64 // selection bias per expert (sigmoid mode); nil = 0
	Groups    int       // expert groups (sigmoid mode); <= 1 = no grouping
	TopKGroup int       // groups kept
	Scale     float64   // routed scaling factor (sigmoid mode); 0 = 1
}

// TopK routes each token's logits ([nTok][nExp]) and returns the chosen
// experts ([nTok][K], best first; ties go to the lower index) and weights.
func TopK(logits []float64, nTok, nExp int, r Route) (ids []int, w []float64) {
	for t := 0; t < nTok; t++ {
		l := logits[t*nExp : (t+1)*nExp]
		sel := RouteScores(l, r)
		if r.Mode == abi.RouteSigmoidTopK && r.Groups > 1 {
			gs := nExp / r.Groups
			keep := map[int]bool{}
			for _, g := range topIdx(GroupScores(sel, r.Groups), r.TopKGroup) {
				keep[g] = true
			}
			for e := range sel {
				if !keep[e/gs] {
					sel[e] = math.Inf(-1)
				}
			}
		}
		top := topIdx(sel, r.K)
		ids = append(ids, top...)
		w = append(w, RouteWeights(l, top, r)...)
	}
	return ids, w
}

// RouteScores returns what routing selects one token's experts by (its
// logits, nExp of them): the logits, or in sigmoid mode their sigmoids
// plus the bias (before the group limit).
func RouteScores(logits []float64, r Route) []float64 {
	sel := make([]float64, len(logits))
	for e, v := range logits {
		sel[e] = v
		if r.Mode == abi.RouteSigmoidTopK {
			sel[e] = 1 / (1 + math.Exp(-v))
			if r.Bias != nil {
				sel[e] += r.Bias[e]
			}
		}
	}
	return sel
}

// GroupScores returns the score of each of groups equal groups of
// experts under a group limit: the sum of its two best selection scores
// (sel, RouteScores'), by which the groups kept are chosen.
func GroupScores(sel []float64, groups int) []float64 {
	gs := len(sel) / groups
	gscore := make([]float64, groups)
	for g := range gscore {
		for _, i := range topIdx(sel[g*gs:(g+1)*gs], 2) {
			gscore[g] += sel[g*gs+i]
		}
	}
	return gscore
}

// RouteWeights returns the weights of the experts ids (best first) of
// one token with logits: softmax over theirs, or in sigmoid mode their
// sigmoids normalized and scaled. TopK's weights of its own choice; a
// test gives it another choice to weigh.
func RouteWeights(logits []float64, ids []int, r Route) []float64 {
	ws := make([]float64, len(ids))
	if r.Mode == abi.RouteSigmoidTopK {
		var sum float64
		for i, e := range ids {
			ws[i] = 1 / (1 + math.Exp(-logits[e]))
			sum += ws[i]
		}
		scale := r.Scale
		if scale == 0 {
			scale = 1
		}
		for i := range ws {
			ws[i] = ws[i] / sum * scale
		}
		return ws
	}
	m := math.Inf(-1)
	for _, e := range ids {
		m = math.Max(m, logits[e])
	}
	var sum float64
	for i, e := range ids {
		ws[i] = math.Exp(logits[e] - m)
		sum += ws[i]
	}
	for i := range ws {
		ws[i] /= sum
	}
	return ws
}

// topIdx returns the indices of the k largest values, largest first, ties
// to the lower index.
func topIdx(v []float64, k int) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return v[idx[a]] > v[idx[b]] })
	return idx[:k]
}

// SwiGLU returns silu(gate) * up.
func SwiGLU(gate, up []float64) []float64 {
	y := make([]float64, len(gate))
	for i, g := range gate {
		y[i] = g / (1 + math.Exp(-g)) * up[i]
	}
	return y
}

// Accumulate returns dst[i] + sum_j w[j] * src[j*d+i] for j < k.
func Accumulate(dst, src, w []float64, k, d int) []float64 {
	y := append([]float64(nil), dst...)
	for j := 0; j < k; j++ {
		for i := 0; i < d; i++ {
			y[i] += w[j] * src[j*d+i]
		}
	}
	return y
}

// Embed returns table rows ids[t] (each d long).
func Embed(table []float64, ids []int, d int) []float64 {
	y := make([]float64, 0, len(ids)*d)
	for _, id := range ids {
		y = append(y, table[id*d:(id+1)*d]...)
	}
	return y
}

// Argmax returns the index of the largest value (the lowest such index;
// NaNs are skipped).
func Argmax(x []float64) int {
	best, bi := math.Inf(-1), 0
	for i, v := range x {
		if v > best {
			best, bi = v, i
		}
	}
	return bi
}

// TopP samples from the nucleus of softmax(logits/temperature): the kept set
// is every token whose probability is at least t*, the largest probability
// such that the tokens at or above it hold at least topP of the mass (ties
// kept together). u in [0, 1) picks, in token order, the first kept token
// whose cumulative kept probability reaches u times the kept mass.
//
// Margin is how far the decision is from flipping: the smallest of the
// distance of topP from the kept mass (unless every token is kept), its
// distance from the mass above t* (the tokens tied at t* go together, so
// a tie that straddles topP is decided), and the distance of u's target
// from the nearest cumulative boundary (none below the first kept token),
// all as probability mass. Tests skip cases whose margin is below float32
// rounding.
func TopP(logits []float64, temperature, topP, u float64) (token int, margin float64) {
	n := len(logits)
	p := make([]float64, n)
	m := math.Inf(-1)
	for _, v := range logits {
		m = math.Max(m, v/temperature)
	}
	var z float64
	for i, v := range logits {
		p[i] = math.Exp(v/temperature - m)
		z += p[i]
	}
	for i := range p {
		p[i] /= z
	}
	sorted := append([]float64(nil), p...)
	sort.Sort(sort.Reverse(sort.Float64Slice(sorted)))
	var cum, above, t float64 // above: the mass of the values above v
	margin = math.Inf(1)
	for i, v := range sorted {
		if i == 0 || sorted[i-1] != v {
			above = cum
		}
		cum += v
		if cum >= topP && (i+1 == n || sorted[i+1] != v) {
			t = v
			margin = topP - above
			if i+1 < n { // past the last value, a larger topP keeps the same
				margin = math.Min(margin, cum-topP)
			}
			break
		}
	}
	var mass float64
	for _, v := range p {
		if v >= t {
			mass += v
		}
	}
	target := u * mass
	cum = 0
	last := 0
	for i, v := range p {
		if v < t {
			continue
		}
		last = i
		prev := cum
		cum += v
		if cum >= target {
			lo := target - prev
			if prev == 0 { // the first kept token: no target below it
				lo = math.Inf(1)
			}
			margin = math.Min(margin, math.Min(lo, cum-target))
			return i, margin
		}
	}
	return last, 0
}

// Tol is a tolerance: |got - want| <= Abs + Rel * scale, where scale is
// |want| or, for dot products, sum |w*x| (see MatMul's mag).
type Tol struct{ Abs, Rel float64 }

// Op names a kernel family for Tolerance.
type Op string

const (
	OpDequant   Op = "dequant"     // Q4_K -> f32: GGML's formula; FMA contraction allowed
	OpDequantF  Op = "dequant_f16" // Q4_K -> f16: one f16 rounding
	OpMatMul    Op = "matmul"      // f32 accumulation; scale = sum |w*x|
	OpRMSNorm   Op = "rmsnorm"
	OpSoftmax   Op = "softmax"
	OpRope      Op = "rope" // plus PosTol per unit of position (f32 angle)
	OpAttention Op = "attention"
	OpRoute     Op = "route" // weights; ids must match exactly
	OpSwiGLU    Op = "swiglu"
	OpAccum     Op = "accumulate"
	OpEmbed     Op = "embed" // exact (a copy; f16 and q4k widen exactly)
)

// Tolerance returns the tolerance the differential tests use for op: a
// float32 kernel against the float64 reference. They are a few times the
// worst error seen on lavapipe and the H100, well below any bug's error.
func Tolerance(op Op) Tol {
	switch op {
	case OpDequant:
		return Tol{Abs: 0, Rel: 1.2e-7} // one float32 rounding of d1*q (FMA)
	case OpDequantF:
		return Tol{Abs: 6e-8, Rel: 4.9e-4} // f16 rounding (2^-11)
	case OpMatMul:
		return Tol{Abs: 1e-30, Rel: 2e-6}
	case OpRMSNorm:
		return Tol{Abs: 1e-30, Rel: 2e-6}
	case OpSoftmax:
		return Tol{Abs: 1e-9, Rel: 2e-6}
	case OpRope:
		return Tol{Abs: 1e-6, Rel: 2e-6}
	case OpAttention:
		return Tol{Abs: 1e-6, Rel: 1e-5}
	case OpRoute:
		return Tol{Abs: 1e-6, Rel: 1e-5}
	case OpSwiGLU:
		return Tol{Abs: 1e-30, Rel: 2e-6}
	case OpAccum:
		return Tol{Abs: 1e-30, Rel: 2e-6}
	case OpEmbed:
		return Tol{}
	}
	return Tol{Abs: math.Inf(1)}
}

// SoftmaxTol is the tolerance of a softmax over rows of d values: Tolerance
// (OpSoftmax) plus float32 rounding that grows with the square root of the
// row (the normalizing sum, whose order of summation is the kernel's to
// choose: a correct kernel that sums in another order than the built-in
// is off by a few times 2e-6 on rows of 150k).
func SoftmaxTol(d int) Tol {
	t := Tolerance(OpSoftmax)
	t.Rel += 1.2e-7 * math.Sqrt(float64(max(d, 1)))
	return t
}

// RopePosTol is the extra relative error RoPE may have per unit of
// position: the float32 product pos*freq is rounded (2^-24 relative), and
// the angle error grows with it.
const RopePosTol = 1.2e-7

// ErrMismatch: a kernel's output differs from the reference beyond the
// tolerance.
var ErrMismatch = errors.New("ref: mismatch")

// Compare checks got against want elementwise: |got-want| <= tol.Abs +
// tol.Rel*scale_i with scale_i = max(|want_i|, scales[i]) (scales may be
// nil). NaN never passes. The error names the first bad element.
func Compare(got []float32, want []float64, scales []float64, tol Tol) error {
	if len(got) != len(want) {
		return fmt.Errorf("%w: got %d values; want %d", ErrMismatch, len(got), len(want))
	}
	bad, worst, worstAt := 0, 0.0, -1
	for i, g := range got {
		s := math.Abs(want[i])
		if scales != nil {
			s = math.Max(s, scales[i])
		}
		diff := math.Abs(float64(g) - want[i])
		allowed := tol.Abs + tol.Rel*s
		if math.IsNaN(float64(g)) || diff > allowed {
			bad++
			r := diff / math.Max(allowed, 1e-300)
			if math.IsNaN(r) || r > worst || worstAt < 0 {
				worst, worstAt = r, i
			}
		}
	}
	if bad > 0 {
		i := worstAt
		return fmt.Errorf("%w: %d of %d elements off; worst at %d: got %v; want %v (|diff| %.3g, %.3gx the tolerance)",
			ErrMismatch, bad, len(got), i, got[i], want[i], math.Abs(float64(got[i])-want[i]), worst)
	}
	return nil
}

// QuantizeX returns the values that a Q4_K product of quantized x (the
// gpu/ops _xq kernels) multiplies by: in each group of 16, the integers
// round(v * 127 / max|v|) (float32 arithmetic, ties to even, clamped to
// [-127, 127]) times max|v| / 127. A GPU's division may differ from Go's
// in the last place, so a value can land one step away in rare ties.
func QuantizeX(x []float64) []float64 {
	out := make([]float64, len(x))
	for g := 0; g+16 <= len(x); g += 16 {
		var amax float32
		for _, v := range x[g : g+16] {
			amax = max(amax, float32(math.Abs(v)))
		}
		if amax == 0 {
			continue
		}
		inv, scale := 127/amax, amax/127
		for i, v := range x[g : g+16] {
			q := float32(math.RoundToEven(float64(float32(v) * inv)))
			out[g+i] = float64(min(max(q, -127), 127)) * float64(scale)
		}
	}
	return out
}
