package lab

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
	"github.com/rdrr/peer/kernels"
)

// An op's harness is what the lab knows of its ABI: how to make a problem
// of a shape (inputs from a seeded stream; the uniform block, the grid and
// the constants from the op's dispatch rule in gpu/ops, the one the
// runtime records), the shapes the gate runs, and how to check an output
// against the float64 reference.
type harness struct {
	// gateShapes are the fixed shapes the gate runs: awkward ones (not
	// multiples of the workgroup, smaller than one workgroup, one row) and
	// a large one. The gate adds one random shape per seed.
	gateShapes [][]int
	// random draws one more shape.
	random func(r *rand.Rand) []int
	// make builds a problem of dims with inputs from r.
	make func(r *rand.Rand, dims []int) (*problem, error)
	// shape is the default shape (DefaultShape).
	shape []int
}

// A problem is one run of an op: its bindings, the dispatches its rules
// make of it (one for most ops; several where the runtime runs the op in
// several, as split attention), and the check of the outputs.
type problem struct {
	binds []binding
	steps []step
	bytes int64 // bytes the op must read and write at least (the roofline)
	// check compares the outputs (by binding index) with the reference and
	// returns the worst error as a multiple of the op's tolerance.
	check func(out map[int][]byte) (float64, error)
}

// A step is one dispatch of a problem: the kernel (the op's built-in,
// where the variant runs in its place, or another built-in of the op's
// runtime form), its uniform block, grid and the override constants the
// rule sets (tile sizes the grid depends on: they win over the variant's,
// as in gpu), and the problem's bindings it binds, in its ABI order.
type step struct {
	kernel string
	params []byte
	groups [3]uint32
	consts map[string]float64
	binds  []int
}

// key names what a step compiles (kernel and constants).
func (st step) key() string { return st.kernel + "/" + constsKey(st.consts) }

// shapeKey names what a problem's dispatches compile and their grids:
// equal for the input sets of one timing.
func (p *problem) shapeKey() string {
	var b strings.Builder
	for _, st := range p.steps {
		fmt.Fprintf(&b, "%s%v;", st.key(), st.groups)
	}
	return b.String()
}

// A binding is one storage buffer: inputs have data; outputs are
// poisoned before every dispatch; an in-place binding (inout: the op reads
// and writes it, like rope's x or accumulate's dst) gets its data copied
// over it before every dispatch, in the same batch (so a timed in-place
// op includes that copy, for the candidate and the baseline alike), and
// is checked like an output.
type binding struct {
	data  []byte // initial contents (inputs, in-place); nil for an output
	size  int    // bytes
	inout bool
}

// output: poisoned before each dispatch.
func (b binding) output() bool { return b.data == nil }

// written: read back and checked after each dispatch.
func (b binding) written() bool { return b.data == nil || b.inout }

// harnesses holds the ops the lab runs: every op of kernels.Ops(). What
// each covers of the runtime's use of its built-in (and what not) is said
// where its make function is.
var harnesses = map[string]harness{
	"rmsnorm": {
		gateShapes: [][]int{{1, 1}, {1, 7}, {3, 255}, {2, 257}, {5, 1000}, {1, 4096}, {33, 2048}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(40), 1 + r.IntN(5000)} },
		make:       makeRMSNorm,
		shape:      []int{1, 4096},
	},
	"softmax": {
		gateShapes: [][]int{{1, 1}, {1, 7}, {3, 255}, {2, 257}, {5, 1000}, {1, 32000}, {33, 2048}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(40), 1 + r.IntN(5000)} },
		make:       makeSoftmax,
		shape:      []int{32, 4096}, // attention scores of 32 heads over 4096 positions
	},
	"swiglu": {
		gateShapes: [][]int{{1}, {7}, {255}, {257}, {1000}, {65537}, {14336 * 4}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(100000)} },
		make:       makeSwiGLU,
		shape:      []int{14336},
	},
	"argmax": {
		gateShapes: [][]int{{1}, {7}, {255}, {257}, {4097}, {32000}, {151936}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(200000)} },
		make:       makeArgmax,
		shape:      []int{32000},
	},
}

// Ops returns the ops the lab can gate and benchmark, sorted.
func Ops() []string { return slices.Sorted(maps.Keys(harnesses)) }

// DefaultShape is the shape `bench` times when none is given: a decode
// step of a Mixtral-8x7B-shaped model (dim 4096, 32 heads, 8 KV heads,
// head dim 128, FFN 14336, 8 experts top-2, vocabulary 32000) unless the
// op's harness says otherwise.
func DefaultShape(op string) []int { return slices.Clone(harnesses[op].shape) }

// maxElems bounds a problem's elements (the host's reference work and
// the buffers): 64 Mi values.
const maxElems = 64 << 20

func elems(dims []int) (int, error) {
	n := 1
	for _, d := range dims {
		if d < 1 || d > maxElems {
			return 0, fmt.Errorf("lab: dimension %d", d)
		}
		n *= d
		if n > maxElems {
			return 0, fmt.Errorf("lab: shape %v has more than %d elements", dims, maxElems)
		}
	}
	return n, nil
}

// dispatched returns p with the dispatch of the op's rule l (from gpu/ops,
// err its error), which binds p's bindings in order. It fails if the rule
// runs another kernel than the op's built-in (the one a variant replaces)
// or asks more of a binding than p holds, so a harness cannot drift from
// the rule.
func dispatched(op string, p *problem, l ops.Launch, err error) (*problem, error) {
	if err != nil {
		return nil, fmt.Errorf("lab: %s: %w", op, err)
	}
	all := make([]int, len(p.binds))
	for i := range all {
		all[i] = i
	}
	return sequenced(op, p, []ops.Launch{l}, [][]int{all})
}

// sequenced returns p with the dispatches of the op's rules ls (its
// runtime form, in order), dispatch i binding p's bindings binds[i]. At
// least one must run the op's built-in (where a variant runs); the others
// run built-ins of their own. Each binding must hold what its rule asks.
func sequenced(op string, p *problem, ls []ops.Launch, binds [][]int) (*problem, error) {
	want := kernels.BuiltinOf(op)
	ours := false
	p.steps = nil
	for i, l := range ls {
		if len(binds[i]) != len(l.Bindings) {
			return nil, fmt.Errorf("lab: %s: dispatch %d (%s) binds %d bindings; the rule has %d", op, i, l.Kernel, len(binds[i]), len(l.Bindings))
		}
		for j, b := range l.Bindings {
			k := binds[i][j]
			if k < 0 || k >= len(p.binds) || uint64(p.binds[k].size) < b.Bytes {
				return nil, fmt.Errorf("lab: %s: dispatch %d (%s) binding %d (%s) needs %d bytes of the problem's binding %d", op, i, l.Kernel, j, b.Name, b.Bytes, k)
			}
		}
		ours = ours || l.Kernel == want
		p.steps = append(p.steps, step{kernel: l.Kernel, params: l.Params, groups: l.Groups, consts: l.Constants, binds: binds[i]})
	}
	if !ours {
		return nil, fmt.Errorf("lab: %s: the dispatch rules do not run the op's built-in %s, which the lab varies", op, want)
	}
	return p, nil
}

func normal(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * scale)
	}
	return out
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// worst returns the largest |got-want| / (Abs + Rel*|want|), and an
// error naming the first element that exceeds 1 or is NaN.
func worst(got []float32, want []float64, tol ref.Tol) (float64, error) {
	return worstScaled(got, want, nil, tol)
}

// worstScaled is worst with the scale of element i max(|want[i]|,
// scales[i]) (scales may be nil), as ref.Compare.
func worstScaled(got []float32, want, scales []float64, tol ref.Tol) (float64, error) {
	if len(got) != len(want) {
		return math.MaxFloat64, fmt.Errorf("%w: %d values; want %d", ref.ErrMismatch, len(got), len(want))
	}
	w, at := 0.0, -1
	for i, g := range got {
		s := math.Abs(want[i])
		if scales != nil {
			s = math.Max(s, scales[i])
		}
		allowed := tol.Abs + tol.Rel*s
		r := math.Abs(float64(g)-want[i]) / math.Max(allowed, 1e-300)
		if math.IsNaN(r) || r > math.MaxFloat64 {
			r = math.MaxFloat64 // finite: reports travel as JSON
		}
		if r > w {
			w, at = r, i
		}
	}
	if w > 1 {
		return w, fmt.Errorf("%w: element %d: got %v; want %v (%.3g x the tolerance)", ref.ErrMismatch, at, got[at], want[at], w)
	}
	return w, nil
}

func makeRMSNorm(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 2 {
		return nil, fmt.Errorf("lab: rmsnorm takes rows, dim")
	}
	n, d := dims[0], dims[1]
	if _, err := elems(dims); err != nil {
		return nil, err
	}
	x := normal(r, n*d, 1+3*r.Float64())
	w := normal(r, d, 1)
	const eps = 1e-5
	want := ref.RMSNorm(ref.F32(x), ref.F32(w), n, d, eps)
	l, err := ops.RMSNormLaunch(ops.NormShape{Rows: n, Dim: d, Eps: eps})
	return dispatched("rmsnorm", &problem{
		binds: []binding{{data: gpu.Bytes(x), size: n * d * 4}, {data: gpu.Bytes(w), size: d * 4}, {size: n * d * 4}},
		bytes: int64(2*n*d+d) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worst(f32s(out[2]), want, ref.Tolerance(ref.OpRMSNorm))
		},
	}, l, err)
}

func makeSoftmax(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 2 {
		return nil, fmt.Errorf("lab: softmax takes rows, dim")
	}
	n, d := dims[0], dims[1]
	if _, err := elems(dims); err != nil {
		return nil, err
	}
	x := normal(r, n*d, 1+4*r.Float64())
	want := ref.Softmax(ref.F32(x), n, d)
	l, err := ops.SoftmaxLaunch(ops.RowsShape{Rows: n, Dim: d})
	return dispatched("softmax", &problem{
		binds: []binding{{data: gpu.Bytes(x), size: n * d * 4}, {size: n * d * 4}},
		bytes: int64(2*n*d) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worst(f32s(out[1]), want, ref.SoftmaxTol(d))
		},
	}, l, err)
}

func makeSwiGLU(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 1 {
		return nil, fmt.Errorf("lab: swiglu takes n")
	}
	n, err := elems(dims)
	if err != nil {
		return nil, err
	}
	g, u := normal(r, n, 2), normal(r, n, 1)
	want := ref.SwiGLU(ref.F32(g), ref.F32(u))
	l, err := ops.SwiGLULaunch(n)
	return dispatched("swiglu", &problem{
		binds: []binding{{data: gpu.Bytes(g), size: n * 4}, {data: gpu.Bytes(u), size: n * 4}, {size: n * 4}},
		bytes: int64(3*n) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worst(f32s(out[2]), want, ref.Tolerance(ref.OpSwiGLU))
		},
	}, l, err)
}

// makeArgmax: the op runs as the runtime's Argmax does (the rules
// ops.ArgmaxLaunches): argmax_blocks over blocks of 4096 values into a
// scratch binding of the blocks' winners, then once more over them; up to
// a block, once. A variant replaces argmax_blocks in every dispatch.
func makeArgmax(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 1 {
		return nil, fmt.Errorf("lab: argmax takes n")
	}
	n, err := elems(dims)
	if err != nil {
		return nil, err
	}
	x := normal(r, n, 3)
	// The largest value appears twice (the lowest index must win) at
	// random places, and a few NaNs (skipped) when there is room.
	if n > 2 {
		top := float32(10 + r.Float64())
		i, j := r.IntN(n), r.IntN(n)
		x[i], x[j] = top, top
		for range min(n/100, 3) {
			x[r.IntN(n)] = float32(math.NaN())
		}
	}
	want := ref.Argmax(ref.F32(x))
	ls, part, err := ops.ArgmaxLaunches(n)
	if err != nil {
		return nil, fmt.Errorf("lab: argmax: %w", err)
	}
	binds := [][]int{{0, 1}}
	if len(ls) == 2 {
		binds = [][]int{{0, 2}, {2, 1}} // x -> the blocks' winners -> out
	}
	return sequenced("argmax", &problem{
		binds: []binding{{data: gpu.Bytes(x), size: n * 4}, {size: 4}, {size: max(int(part), 4)}},
		bytes: int64(n)*4 + 4,
		check: func(out map[int][]byte) (float64, error) {
			got := binary.LittleEndian.Uint32(out[1])
			if int64(got) != int64(want) {
				return 1e300, fmt.Errorf("%w: argmax %d; want %d", ref.ErrMismatch, got, want)
			}
			return 0, nil
		},
	}, ls, binds)
}
