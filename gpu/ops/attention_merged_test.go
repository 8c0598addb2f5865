package ops

import (
	"fmt"
	"math"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ref"
)

// TestAttentionMerged: the split that merges its chunks itself (Merged,
// attention_split's MERGE flavors) gives the reference's attention and,
// within a few roundings, the output of the split and merge (its tree
// adds the chunks in another order); quantized, within a step of
// ref.QuantizeX of its own output. Three dispatches a batch, each after
// the one before on other queries: each must find its counters zero,
// which only the last workgroup of the dispatch before sets back. Shapes
// it cannot take (chunks other than 32, head dims other than 32, 64 and
// 128) run the split and the merge: the same bits.
func TestAttentionMerged(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct {
		s      AttnShape
		ch     int
		merged bool
	}{
		{AttnShape{Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 1}, 32, true},
		{AttnShape{Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 300}, 32, true},
		{AttnShape{Heads: 8, KVHeads: 2, HeadDim: 64, KVLen: 33}, 32, true},
		{AttnShape{Heads: 4, KVHeads: 4, HeadDim: 32, KVLen: 1000}, 32, true},   // 32 groups of chunks a column
		{AttnShape{Heads: 16, KVHeads: 2, HeadDim: 128, KVLen: 70}, 32, true},   // 8 query heads a cache head: one group
		{AttnShape{Heads: 128, KVHeads: 8, HeadDim: 128, KVLen: 70}, 32, true},  // two z groups a cache head
		{AttnShape{Heads: 6, KVHeads: 2, HeadDim: 64, KVLen: 4096}, 32, true},   // 96 columns (three heads): 2 groups, 64 idle threads
		{AttnShape{Heads: 2, KVHeads: 1, HeadDim: 32, KVLen: 20000}, 32, true},  // many batches of loads a thread
		{AttnShape{Heads: 4, KVHeads: 2, HeadDim: 48, KVLen: 100}, 32, false},   // head dim
		{AttnShape{Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 300}, 16, false}, // chunk
	} {
		for _, xq := range []bool{false, true} {
			if xq && c.s.HeadDim%XQGroup != 0 {
				continue
			}
			s := c.s
			s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
			t.Run(fmt.Sprintf("%+v/ch%d/xq=%v", s, c.ch, xq), func(t *testing.T) {
				defer func(ch int) { attnChunk = ch }(attnChunk)
				attnChunk = c.ch
				split, _, _, err := AttentionLaunches(s)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := MergedSplit(split, s, xq); ok != c.merged {
					t.Fatalf("MergedSplit: %v; want %v", ok, c.merged)
				}
				n := s.Heads * s.HeadDim
				kvn := s.KVLen * s.KVHeads * s.HeadDim
				kc, vc := randF32(r, kvn, 1), randF32(r, kvn, 1)
				kb, vb := uploadF32(t, d, kc), uploadF32(t, d, vc)
				const runs = 3
				var qs [runs][]float32
				var qb, plain, out, outq [runs]gpu.Region
				for i := range runs {
					qs[i] = randF32(r, n, 1)
					qb[i] = uploadF32(t, d, qs[i])
					plain[i], out[i] = poisoned(t, d, n*4), poisoned(t, d, n*4)
					if xq {
						outq[i] = poisoned(t, d, int(XQBytes(n)))
					}
				}
				m := s
				m.Merged = true
				run(t, d, func(b *gpu.Batch) error {
					for i := range runs {
						if err := k.Attention(ctxT(t), b, qb[i], kb, vb, plain[i], s); err != nil {
							return err
						}
						var err error
						if xq {
							err = k.AttentionXQ(ctxT(t), b, qb[i], kb, vb, out[i], outq[i], m)
						} else {
							err = k.Attention(ctxT(t), b, qb[i], kb, vb, out[i], m)
						}
						if err != nil {
							return err
						}
					}
					return nil
				})
				for i := range runs {
					want := ref.Attention(ref.F32(qs[i]), ref.F32(kc), ref.F32(vc), s.Heads, s.KVHeads, s.HeadDim, s.KVLen, float64(s.Scale))
					got, two := readF32(t, d, out[i], n), readF32(t, d, plain[i], n)
					if err := ref.Compare(got, want, nil, ref.Tolerance(ref.OpAttention)); err != nil {
						t.Fatalf("dispatch %d: %v", i, err)
					}
					for j := range got {
						if !c.merged && math.Float32bits(got[j]) != math.Float32bits(two[j]) {
							t.Fatalf("dispatch %d: out[%d] = %g; the split and the merge give %g", i, j, got[j], two[j])
						}
						if diff := math.Abs(float64(got[j] - two[j])); diff > 1e-5*(1+math.Abs(float64(two[j]))) {
							t.Fatalf("dispatch %d: out[%d] = %g; the split and the merge give %g", i, j, got[j], two[j])
						}
					}
					if xq {
						withinStep(t, fmt.Sprintf("dispatch %d: out", i), got, readXQ(t, d, outq[i], n), ref.QuantizeX(ref.F32(got)))
					}
				}
			})
		}
	}
}

// TestRopeAttentionMerged: RoPE, the cache store, the attention and its
// merge in one dispatch (attention_split_rope_merge) write the caches of
// RopeAttention without Merged, the same bits, and its output within a
// few roundings (quantized: within a step of ref.QuantizeX of its own).
// Two steps in one batch, the second reading the row the first stored.
func TestRopeAttentionMerged(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ nq, nkv, hd, pos int }{{32, 8, 128, 0}, {32, 8, 128, 300}, {8, 2, 64, 63}, {128, 8, 128, 70}} {
		for _, xq := range []bool{false, true} {
			t.Run(fmt.Sprintf("%+v/xq=%v", c, xq), func(t *testing.T) {
				kvn := c.nkv * c.hd
				rows := c.pos + 3
				cacheK, cacheV := randF32(r, rows*kvn, 1), randF32(r, rows*kvn, 1)
				freqs := uploadF32(t, d, RopeFreqs(10000, c.hd))
				nout := c.nq * c.hd
				var xs [2][]float32
				for i := range xs {
					xs[i] = randF32(r, (c.nq+2*c.nkv)*c.hd, 1)
				}
				var caches, outs [2][2][]float32 // by merged, then k and v; by merged, then step
				for mi, merged := range []bool{false, true} {
					kc, vc := uploadF32(t, d, cacheK), uploadF32(t, d, cacheV)
					var out, outq [2]gpu.Region
					run(t, d, func(b *gpu.Batch) error {
						for step := range 2 {
							pos := c.pos + step
							as := AttnShape{Heads: c.nq, KVHeads: c.nkv, HeadDim: c.hd, KVLen: pos + 1, Scale: float32(1 / math.Sqrt(float64(c.hd))), Merged: merged}
							rs := RopeShape{Tokens: 1, Heads: c.nq + c.nkv, HeadDim: c.hd, RotDim: c.hd, Pos0: pos, Style: abi.RopeNeoX}
							kv := KVShape{Dim: kvn, KOff: c.nq * c.hd, VOff: (c.nq + c.nkv) * c.hd, Pos: pos}
							split, _, _, ok, err := RopeAttentionLaunches(as, rs, kv)
							if err != nil || !ok {
								t.Fatalf("RopeAttentionLaunches: fused %v, %v", ok, err)
							}
							if _, ok := MergedSplit(split, as, xq); !ok {
								t.Fatalf("MergedSplit(%s): not merged", split.Kernel)
							}
							out[step] = poisoned(t, d, nout*4)
							if xq {
								outq[step] = poisoned(t, d, int(XQBytes(nout)))
							}
							if err := k.RopeAttention(ctxT(t), b, uploadF32(t, d, xs[step]), freqs, kc, vc, out[step], outq[step], as, rs, kv); err != nil {
								return err
							}
						}
						return nil
					})
					caches[mi] = [2][]float32{readF32(t, d, kc, rows*kvn), readF32(t, d, vc, rows*kvn)}
					outs[mi] = [2][]float32{readF32(t, d, out[0], nout), readF32(t, d, out[1], nout)}
					if merged && xq {
						for step := range 2 {
							withinStep(t, fmt.Sprintf("step %d: out", step), outs[mi][step], readXQ(t, d, outq[step], nout), ref.QuantizeX(ref.F32(outs[mi][step])))
						}
					}
				}
				for j, name := range []string{"k cache", "v cache"} {
					for i := range caches[0][j] {
						if g, w := math.Float32bits(caches[1][j][i]), math.Float32bits(caches[0][j][i]); g != w {
							t.Fatalf("%s[%d] = %v merged; %v not", name, i, caches[1][j][i], caches[0][j][i])
						}
					}
				}
				for step := range 2 {
					for i, w := range outs[0][step] {
						g := outs[1][step][i]
						if diff := math.Abs(float64(g - w)); diff > 1e-5*(1+math.Abs(float64(w))) || math.IsNaN(float64(g)) {
							t.Fatalf("step %d: out[%d] = %g merged; %g not", step, i, g, w)
						}
					}
				}
			})
		}
	}
}
