package lab

import (
	"fmt"
	"math/rand/v2"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
)

// Harnesses of the matrix ops: q4k_dequant, dense_matmul and the three
// ops of q4k_matmul.wgsl (q4k_matvec, q4k_matmul, q4k_matvec_group).
//
// The three Q4_K product ops share the built-in q4k_matmul (plain
// flavor). Each dispatches it by its rule in gpu/ops (ops.Q4KLaunch,
// ops.GroupLaunch), with the configuration ops.DefaultQ4KConfig picks for
// the shape: grid, uniform block and the override constants ROWS, TOK,
// CONV, PIPE, POS, WG (and GROUPED) that the rule sets and that win over a
// variant's own, so a variant must declare them and honour them. Not
// covered: the masked flavor (q4k_matmul_masked, the MoE path with the
// router's choice on the GPU, a built-in of its own), ACC (Q4KMatVecAdd)
// and the coalesced q4k_matvec_co kernel, which DefaultQ4KConfig does not
// pick.

func init() {
	harnesses["q4k_dequant"] = harness{
		// weights (a multiple of 256)
		gateShapes: [][]int{{256}, {768}, {32 * 256}, {33 * 256}, {257 * 256}, {4096 * 256}},
		random:     func(r *rand.Rand) []int { return []int{256 * (1 + r.IntN(2000))} },
		make:       makeQ4KDequant,
		shape:      []int{4096 * 4096}, // one attention projection
	}
	harnesses["dense_matmul"] = harness{
		// rows, cols, tokens
		gateShapes: [][]int{{1, 1, 1}, {3, 5, 1}, {2, 257, 1}, {7, 1000, 1}, {8, 4096, 1}, {130, 64, 2}, {3, 7, 3}, {9, 1024, 8}, {2, 40, 9}, {1000, 1024, 1}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(300), 1 + r.IntN(3000), 1 + r.IntN(12)} },
		make:       makeDenseMatMul,
		shape:      []int{8, 4096, 1}, // the router: 8 experts' logits (f32 weights)
	}
	harnesses["q4k_matvec"] = harness{
		// rows, cols
		gateShapes: [][]int{{1, 256}, {3, 256}, {7, 512}, {33, 2304}, {130, 1024}, {5, 14336}, {257, 4096}, {300, 2304}, {260, 14336}, {2048, 2048}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(600), 256 * (1 + r.IntN(24))} },
		make:       makeQ4KMatVec,
		shape:      []int{4096, 4096}, // the query (and output) projection
	}
	harnesses["q4k_matmul"] = harness{
		// rows, cols, tokens
		gateShapes: [][]int{{1, 256, 2}, {3, 512, 2}, {17, 1280, 3}, {9, 256, 5}, {4, 2048, 9}, {65, 768, 8}, {300, 2304, 4}, {1, 256, 70}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(300), 256 * (1 + r.IntN(12)), 1 + r.IntN(16)} },
		make:       makeQ4KMatMul,
		shape:      []int{4096, 4096, 8}, // a projection over 8 tokens (prompt, speculation)
	}
	harnesses["q4k_matvec_group"] = harness{
		// products, rows, cols
		gateShapes: [][]int{{1, 1, 256}, {4, 37, 512}, {2, 300, 2560}, {16, 5, 768}, {3, 260, 1024}, {2, 64, 14336}, {8, 512, 2048}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(16), 1 + r.IntN(300), 256 * (1 + r.IntN(12))} },
		make:       makeQ4KGroup,
		shape:      []int{2, 14336, 4096}, // the gate projections of the top-2 experts
	}
}

// maxQ4KWeights bounds the weights of a Q4_K problem (its blocks, for the
// host and the device, are 0.56 bytes a weight; its reference is computed
// a row at a time).
const maxQ4KWeights = 1 << 28

func checkQ4KShape(op string, rows, cols, n, products int) error {
	if rows < 1 || cols < 256 || cols%256 != 0 || n < 1 || products < 1 {
		return fmt.Errorf("lab: %s: %d rows of %d columns (a positive multiple of 256), %d tokens, %d products", op, rows, cols, n, products)
	}
	if w := int64(rows) * int64(cols) * int64(products); w > maxQ4KWeights || int64(n)*int64(cols) > maxElems || int64(n)*int64(rows)*int64(products) > maxElems {
		return fmt.Errorf("lab: %s: %dx%d x %d products, %d tokens is too large", op, rows, cols, products, n)
	}
	return nil
}

func makeQ4KDequant(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 1 {
		return nil, fmt.Errorf("lab: q4k_dequant takes weights")
	}
	n := dims[0]
	if n < 256 || n%256 != 0 || n > maxElems {
		return nil, fmt.Errorf("lab: q4k_dequant of %d weights (a positive multiple of 256, at most %d)", n, maxElems)
	}
	blocks := q4kBlocks(r, n/256)
	want, err := ref.Q4K(blocks)
	if err != nil {
		return nil, err
	}
	// f32 output (the f16 output, OUT_F16 = 1, is not covered).
	l, err := ops.Q4KDequantLaunch(abi.F32, n)
	return dispatched("q4k_dequant", &problem{
		binds: []binding{{data: blocks, size: len(blocks)}, {size: n * 4}},
		bytes: int64(len(blocks)) + int64(n)*4,
		check: func(out map[int][]byte) (float64, error) {
			return worst(f32s(out[1]), want, ref.Tolerance(ref.OpDequant))
		},
	}, l, err)
}

// makeDenseMatMul: y[t] = W x[t] with f32 weights (what the runtime runs:
// the router; f16 weights, W_F16 = 1, are not covered), the 16-byte path
// when cols % 4 == 0.
func makeDenseMatMul(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 3 {
		return nil, fmt.Errorf("lab: dense_matmul takes rows, cols, tokens")
	}
	rows, cols, n := dims[0], dims[1], dims[2]
	for _, d := range [][]int{{rows, cols}, {n, cols}, {n, rows}} {
		if _, err := elems(d); err != nil {
			return nil, err
		}
	}
	w := normal(r, rows*cols, 0.5)
	x := normal(r, n*cols, 1)
	want, mag := ref.MatMul(ref.F32(w), ref.F32(x), rows, cols, n)
	l, err := ops.DenseLaunch(abi.F32, ops.MatShape{Rows: rows, Cols: cols, Tokens: n})
	return dispatched("dense_matmul", &problem{
		binds: []binding{{data: gpu.Bytes(w), size: rows * cols * 4}, {data: gpu.Bytes(x), size: n * cols * 4}, {size: n * rows * 4}},
		bytes: int64(rows*cols+n*cols+n*rows) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worstScaled(f32s(out[2]), want, mag, ref.Tolerance(ref.OpMatMul))
		},
	}, l, err)
}

func makeQ4KMatVec(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 2 {
		return nil, fmt.Errorf("lab: q4k_matvec takes rows, cols")
	}
	return makeQ4KProduct(r, "q4k_matvec", dims[0], dims[1], 1)
}

func makeQ4KMatMul(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 3 {
		return nil, fmt.Errorf("lab: q4k_matmul takes rows, cols, tokens")
	}
	return makeQ4KProduct(r, "q4k_matmul", dims[0], dims[1], dims[2])
}

// makeQ4KProduct: y[t] = W x[t] for n tokens, as the runtime's
// Q4KMatMul dispatches it.
func makeQ4KProduct(r *rand.Rand, op string, rows, cols, n int) (*problem, error) {
	if err := checkQ4KShape(op, rows, cols, n, 1); err != nil {
		return nil, err
	}
	s := ops.MatShape{Rows: rows, Cols: cols, Tokens: n}
	l, err := ops.Q4KLaunch(ops.DefaultQ4KConfig(rows, cols, n), s, false)
	if err != nil {
		return nil, fmt.Errorf("lab: %s: %w", op, err)
	}
	blocks := q4kBlocks(r, rows*cols/256)
	x := normal(r, n*cols, 1)
	want, mag, err := ref.Q4KMatMul(blocks, ref.F32(x), rows, cols, n)
	if err != nil {
		return nil, err
	}
	return dispatched(op, &problem{
		binds: []binding{{data: blocks, size: len(blocks)}, {data: gpu.Bytes(x), size: n * cols * 4}, {size: n * rows * 4}},
		bytes: int64(len(blocks)) + int64(n*cols+n*rows)*4,
		check: func(out map[int][]byte) (float64, error) {
			return worstScaled(f32s(out[2]), want, mag, ref.Tolerance(ref.OpMatMul))
		},
	}, l, nil)
}

// makeQ4KGroup: products independent products y[e] = W[slots[e]] x[e] in
// one dispatch, as the runtime's Q4KMatVecGroup records them: the matrices in an
// arena of as many slots as products, in a random order (and, half the
// time, one slot used twice), x per product or (half the time) one x
// shared by all.
func makeQ4KGroup(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 3 {
		return nil, fmt.Errorf("lab: q4k_matvec_group takes products, rows, cols")
	}
	products, rows, cols := dims[0], dims[1], dims[2]
	if products > ops.MaxGroup {
		return nil, fmt.Errorf("lab: q4k_matvec_group of %d products (at most %d)", products, ops.MaxGroup)
	}
	if err := checkQ4KShape("q4k_matvec_group", rows, cols, 1, products); err != nil {
		return nil, err
	}
	slotBytes := rows * cols / 256 * 144
	slots := r.Perm(products)
	if products > 1 && r.IntN(2) == 0 {
		slots[products-1] = slots[0]
	}
	shared := r.IntN(2) == 0
	nx := products
	if shared {
		nx = 1
	}
	arena := q4kBlocks(r, products*rows*cols/256)
	x := normal(r, nx*cols, 1)
	x64 := ref.F32(x)
	var want, mag []float64
	read := map[int]bool{}
	for e, s := range slots {
		xe := x64
		if !shared {
			xe = x64[e*cols : (e+1)*cols]
		}
		y, m, err := ref.Q4KMatMul(arena[s*slotBytes:(s+1)*slotBytes], xe, rows, cols, 1)
		if err != nil {
			return nil, err
		}
		want, mag = append(want, y...), append(mag, m...)
		read[s] = true
	}
	l, err := ops.GroupLaunch(ops.DefaultQ4KConfig(rows*products, cols, 1), ops.Group{Slots: slots, SharedX: shared, Rows: rows, Cols: cols})
	return dispatched("q4k_matvec_group", &problem{
		binds: []binding{{data: arena, size: len(arena)}, {data: gpu.Bytes(x), size: nx * cols * 4}, {size: products * rows * 4}},
		bytes: int64(len(read)*slotBytes) + int64(nx*cols+products*rows)*4,
		check: func(out map[int][]byte) (float64, error) {
			return worstScaled(f32s(out[2]), want, mag, ref.Tolerance(ref.OpMatMul))
		},
	}, l, err)
}
