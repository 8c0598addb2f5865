package lab

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/rdrr/peer/gpu/ref"
)

// Harnesses of accumulate, embed and rope (gpu/ops.Kernels.Accumulate,
// Embed, Rope: one dispatch of their built-in each, by the rules
// ops.AccumulateLaunch, EmbedLaunch, RopeLaunch).

func init() {
	harnesses["accumulate"] = harness{
		// experts, dim
		gateShapes: [][]int{{1, 1}, {1, 7}, {2, 255}, {3, 257}, {8, 1000}, {2, 4096}, {16, 7168}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(16), 1 + r.IntN(20000)} },
		make:       makeAccumulate,
		shape:      []int{2, 4096}, // the top-2 experts' outputs into the residual stream
	}
	harnesses["embed"] = harness{
		// tokens, dim
		gateShapes: [][]int{{1, 1}, {1, 7}, {3, 255}, {2, 256}, {5, 1000}, {1, 4096}, {9, 768}, {300, 33}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(16), 1 + r.IntN(5000)} },
		make:       makeEmbed,
		shape:      []int{1, 4096},
	}
	harnesses["rope"] = harness{
		// tokens, heads, headDim
		gateShapes: [][]int{{1, 1, 2}, {1, 1, 3}, {3, 5, 64}, {2, 4, 10}, {9, 3, 33}, {1, 40, 128}, {17, 32, 128}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(8), 1 + r.IntN(48), 2 + r.IntN(255)} },
		make:       makeRope,
		shape:      []int{1, 32, 128}, // the query heads of a decode step
	}
}

// dims2 checks an op's two dimensions.
func dims2(op string, dims []int, names string) (int, int, error) {
	if len(dims) != 2 {
		return 0, 0, fmt.Errorf("lab: %s takes %s", op, names)
	}
	if _, err := elems(dims); err != nil {
		return 0, 0, err
	}
	return dims[0], dims[1], nil
}

// makeAccumulate: dst[i] += sum_j w[wOff+j] * src[j*d+i], dst in place,
// the weights at a random offset into their buffer (as Route's output is
// read).
func makeAccumulate(r *rand.Rand, dims []int) (*problem, error) {
	k, d, err := dims2("accumulate", dims, "experts, dim")
	if err != nil {
		return nil, err
	}
	src := normal(r, k*d, 1)
	wOff := r.IntN(4)
	w := normal(r, wOff+k, 0.5)
	dst := normal(r, d, 2)
	// The error of a float32 sum grows with the magnitude of its terms.
	mag := make([]float64, d)
	for i := range mag {
		mag[i] = math.Abs(float64(dst[i]))
		for j := range k {
			mag[i] += math.Abs(float64(w[wOff+j]) * float64(src[j*d+i]))
		}
	}
	want := ref.Accumulate(ref.F32(dst), ref.F32(src), ref.F32(w[wOff:]), k, d)
	l, err := ops.AccumulateLaunch(ops.AccumShape{Experts: k, Dim: d, WeightOff: wOff})
	return dispatched("accumulate", &problem{
		binds: []binding{{data: gpu.Bytes(src), size: k * d * 4}, {data: gpu.Bytes(w), size: (wOff + k) * 4}, {data: gpu.Bytes(dst), size: d * 4, inout: true}},
		bytes: int64(k*d+2*d+k) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worstScaled(f32s(out[2]), want, mag, ref.Tolerance(ref.OpAccum))
		},
	}, l, err)
}

// embedVocab bounds the table of an embed problem (rows of the op's d):
// the op reads only the rows of its ids, so a small table tells as much.
const embedTable = 1 << 22

// makeEmbed: y[t] = table[ids[t]]. The table's type follows the row
// length: Q4_K when d is a multiple of 256 (what the runtime embeds),
// else f16 for odd rows (halves straddle words), else f32. Ids are in
// range, repeat, and include the first and last row.
func makeEmbed(r *rand.Rand, dims []int) (*problem, error) {
	n, d, err := dims2("embed", dims, "tokens, dim")
	if err != nil {
		return nil, err
	}
	vocab := 1 + r.IntN(max(1, min(32000, embedTable/d)))
	var dt abi.DType
	var table []byte
	var t64 []float64
	tol := ref.Tolerance(ref.OpEmbed)
	switch {
	case d%256 == 0:
		dt = abi.Q4K
		table = q4kBlocks(r, vocab*d/256)
		tol = ref.Tolerance(ref.OpDequant)
	case d%2 == 1:
		dt = abi.F16
		hs := make([]uint16, vocab*d)
		for i := range hs {
			hs[i] = q4k.ToF16(float32(r.NormFloat64()))
		}
		table, t64 = gpu.Bytes(hs), ref.F16(hs)
	default:
		f := normal(r, vocab*d, 1)
		table, t64 = gpu.Bytes(f), ref.F32(f)
	}
	ids := make([]uint32, n)
	iids := make([]int, n)
	for i := range ids {
		ids[i] = uint32(r.IntN(vocab))
		switch {
		case i == 1:
			ids[i] = uint32(vocab - 1)
		case i == 2:
			ids[i] = 0
		case i > 2 && r.IntN(4) == 0:
			ids[i] = ids[r.IntN(i)]
		}
		iids[i] = int(ids[i])
	}
	var want []float64
	if dt == abi.Q4K {
		// Rows are whole blocks: decode only the rows the ids read.
		rb := d / 256 * 144
		for _, id := range iids {
			row, err := ref.Q4K(table[id*rb : (id+1)*rb])
			if err != nil {
				return nil, err
			}
			want = append(want, row...)
		}
	} else {
		want = ref.Embed(t64, iids, d)
	}
	l, err := ops.EmbedLaunch(ops.EmbedShape{Type: dt, Tokens: n, Dim: d, Vocab: vocab})
	return dispatched("embed", &problem{
		binds: []binding{{data: table, size: len(table)}, {data: gpu.Bytes(ids), size: n * 4}, {size: n * d * 4}},
		bytes: int64(n)*4 + int64(dt.Bytes(n*d)) + int64(n*d)*4,
		check: func(out map[int][]byte) (float64, error) {
			return worst(f32s(out[2]), want, tol)
		},
	}, l, err)
}

// makeRope: x ([tokens][heads][headDim]) rotated in place at positions
// pos0.. (random, up to 32k), NeoX or GPT-J pairs, by f32 frequencies of
// theta 1e4 or 1e6 (what is uploaded is what the reference widens). Heads
// of 64 or more rotate whole (as the runtime's), shorter ones about three
// quarters (even), the rest left as it is.
func makeRope(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 3 {
		return nil, fmt.Errorf("lab: rope takes tokens, heads, headDim")
	}
	tok, heads, hd := dims[0], dims[1], dims[2]
	n, err := elems(dims)
	if err != nil {
		return nil, err
	}
	if hd < 2 {
		return nil, fmt.Errorf("lab: rope needs headDim >= 2")
	}
	rot := hd &^ 1
	if hd < 64 {
		rot = max(2, hd*3/4&^1)
	}
	pos0 := r.IntN(32768)
	style := abi.RopeStyle(r.IntN(2))
	theta := 1e4
	if r.IntN(2) == 0 {
		theta = 1e6
	}
	x := normal(r, n, 1)
	freqs := ops.RopeFreqs(theta, rot)
	want := ref.Rope(ref.F32(x), tok, heads, hd, rot, pos0, ref.F32(freqs), style)
	// Error scale per element (as gpu's test): the magnitude of its pair,
	// grown with the position (the f32 angle's rounding grows with it).
	tol := ref.Tolerance(ref.OpRope)
	scales := make([]float64, n)
	half := rot / 2
	for t := range tok {
		grow := 1 + float64(pos0+t)*ref.RopePosTol/tol.Rel
		for h := range heads {
			base := (t*heads + h) * hd
			for i := range half {
				ia, ib := base+i, base+i+half
				if style == abi.RopeGPTJ {
					ia, ib = base+2*i, base+2*i+1
				}
				m := (math.Abs(float64(x[ia])) + math.Abs(float64(x[ib]))) * grow
				scales[ia], scales[ib] = m, m
			}
		}
	}
	l, err := ops.RopeLaunch(ops.RopeShape{Tokens: tok, Heads: heads, HeadDim: hd, RotDim: rot, Pos0: pos0, Style: style})
	return dispatched("rope", &problem{
		binds: []binding{{data: gpu.Bytes(x), size: n * 4, inout: true}, {data: gpu.Bytes(freqs), size: half * 4}},
		bytes: int64(2*tok*heads*rot+half) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worstScaled(f32s(out[0]), want, scales, tol)
		},
	}, l, err)
}

// q4kBlocks returns n valid Q4_K blocks: the first few quantized from
// normal weights by gpu/q4k's codec, the rest random quants and 6-bit
// scales with d and dmin of the magnitude quantized weights have.
func q4kBlocks(r *rand.Rand, n int) []byte {
	out := make([]byte, n*q4k.BlockBytes)
	coded := min(n, 4)
	w := make([]float32, coded*q4k.BlockWeights)
	for i := range w {
		w[i] = float32(r.NormFloat64() * 0.02)
	}
	if err := q4k.Quantize(out[:coded*q4k.BlockBytes], w); err != nil {
		panic(err) // sizes are ours
	}
	for b := coded; b < n; b++ {
		blk := out[b*q4k.BlockBytes : (b+1)*q4k.BlockBytes]
		for i := 4; i < len(blk); i += 4 {
			binary.LittleEndian.PutUint32(blk[i:], r.Uint32())
		}
		binary.LittleEndian.PutUint16(blk[0:], q4k.ToF16(float32(0.001+0.01*r.Float64())))
		binary.LittleEndian.PutUint16(blk[2:], q4k.ToF16(float32(0.001+0.02*r.Float64())))
	}
	return out
}
