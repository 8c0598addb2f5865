package lab

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
)

// The harness of attention_decode. The op runs as the runtime's Attention
// does (the rules ops.AttentionLaunches): attention_split over chunks of
// positions into a scratch binding of partials (flash-decoding), then
// attention_merge. A variant replaces attention_split, the op's built-in;
// the merge stays the built-in's. The shapes are
// limited as gpu/ops's Attention limits them (HeadDim <= 256 and a multiple of
// 4, Heads a multiple of KVHeads, at most 1024 dimensions in 8 query heads
// of a cache head), so a variant passing here has the runtime's ABI. The
// rule sets the split's override constants CH (the chunk), V (main_v's
// shapes) and, with V, HD (their head dimension), NKV (the cache heads)
// and GQ (the query heads of one): a variant declares all five, ABI 5 (4
// had CH, V and HD; 3 CH alone).

func init() {
	harnesses["attention_decode"] = harness{
		// heads, kvHeads, headDim, kvLen
		gateShapes: [][]int{{1, 1, 4, 1}, {8, 2, 64, 7}, {4, 4, 24, 300}, {2, 2, 20, 129}, {6, 1, 100, 513}, {2, 1, 256, 1000}, {32, 8, 128, 257}, {12, 1, 64, 65}},
		random: func(r *rand.Rand) []int {
			kv := 1 << r.IntN(4)
			g := 1 + r.IntN(8)
			hd := 4 * (1 + r.IntN(min(64, 1024/(4*g))))
			return []int{kv * g, kv, hd, 1 + r.IntN(2000)}
		},
		make:  makeAttention,
		shape: []int{32, 8, 128, 4096}, // a decode step at position 4096
	}
}

// attnSpare is the most cache rows past kvLen an attention problem's
// cache holds (the cache is [maxLen][kvHeads][headDim], filled with NaN
// past the positions in use, so a kernel that reads them fails).
const attnSpare = 16

func makeAttention(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 4 {
		return nil, fmt.Errorf("lab: attention_decode takes heads, kvHeads, headDim, kvLen")
	}
	heads, kv, hd, kvLen := dims[0], dims[1], dims[2], dims[3]
	if heads <= 0 || kv <= 0 || heads%kv != 0 || hd <= 0 || hd > 256 || hd%4 != 0 || kvLen <= 0 || heads > 65535 ||
		min(heads/kv, 8)*hd > 1024 || kvLen > 1<<24 {
		return nil, fmt.Errorf("lab: attention_decode %v (headDim <= 256 and a multiple of 4; heads a multiple of kvHeads; at most 1024 dimensions in 8 query heads)", dims)
	}
	spare := min(kvLen, attnSpare)
	row := kv * hd
	if _, err := elems([]int{kvLen + spare, row}); err != nil {
		return nil, err
	}
	q := normal(r, heads*hd, 1+2*r.Float64()) // sharper or flatter scores
	k := normal(r, (kvLen+spare)*row, 1)
	v := normal(r, (kvLen+spare)*row, 1)
	nan := float32(math.NaN())
	for i := kvLen * row; i < len(k); i++ {
		k[i], v[i] = nan, nan
	}
	scale := float32(1 / math.Sqrt(float64(hd)))
	q64, k64, v64 := ref.F32(q), ref.F32(k[:kvLen*row]), ref.F32(v[:kvLen*row])
	want := ref.Attention(q64, k64, v64, heads, kv, hd, kvLen, float64(scale))
	// The error scale of an output is the weighted sum of the magnitudes
	// of the values it averages (an output near 0 is a sum of large terms
	// that cancel).
	for i, x := range v64 {
		v64[i] = math.Abs(x)
	}
	mag := ref.Attention(q64, k64, v64, heads, kv, hd, kvLen, float64(scale))
	split, merge, partials, err := ops.AttentionLaunches(ops.AttnShape{Heads: heads, KVHeads: kv, HeadDim: hd, KVLen: kvLen, Scale: scale})
	if err != nil {
		return nil, fmt.Errorf("lab: attention_decode: %w", err)
	}
	return sequenced("attention_decode", &problem{
		binds: []binding{{data: gpu.Bytes(q), size: len(q) * 4}, {data: gpu.Bytes(k), size: len(k) * 4},
			{data: gpu.Bytes(v), size: len(v) * 4}, {size: heads * hd * 4}, {size: int(partials)}},
		bytes: int64(2*heads*hd+2*kvLen*row) * 4,
		check: func(out map[int][]byte) (float64, error) {
			return worstScaled(f32s(out[3]), want, mag, ref.Tolerance(ref.OpAttention))
		},
	}, []ops.Launch{split, merge}, [][]int{{0, 1, 2, 4}, {4, 3}})
}
