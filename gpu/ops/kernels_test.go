package ops

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/rdrr/peer/gpu/ref"
)

// Differential tests: every kernel against its float64 reference in
// gpu/ref on random inputs and awkward shapes (not multiples of the
// workgroup size, single rows, large K), with the tolerance
// ref.Tolerance(op) states. Outputs start poisoned (NaN), so an element a
// kernel forgets to write fails.

// randQ4K returns random but realistic Q4_K blocks: random quants and 6-bit
// scales, d and dmin of the magnitude quantized weights have.
func randQ4K(r *rand.Rand, nblocks int) []byte {
	out := make([]byte, nblocks*q4k.BlockBytes)
	for b := 0; b < nblocks; b++ {
		blk := out[b*q4k.BlockBytes:]
		for i := 4; i < q4k.BlockBytes; i++ {
			blk[i] = byte(r.Uint32())
		}
		binary.LittleEndian.PutUint16(blk[0:], q4k.ToF16(float32(0.001+0.01*r.Float64())))
		binary.LittleEndian.PutUint16(blk[2:], q4k.ToF16(float32(0.001+0.02*r.Float64())))
	}
	return out
}

func TestQ4KKnownBlocksGPU(t *testing.T) {
	d, k := shared.d, shared.k
	blocks, want := q4k.KnownBlocks()
	n := len(want)
	w := upload(t, d, blocks)
	y := poisoned(t, d, n*4)
	run(t, d, func(b *gpu.Batch) error { return k.Q4KDequant(ctxT(t), b, abi.F32, w, y, n) })
	got := readF32(t, d, y, n)
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("weight %d (block %d): got %v; want %v exactly", i, i/256, got[i], want[i])
		}
	}
	// A one-hot x picks one weight through the fused product: exact too.
	// Rows are the 4 known blocks (cols 256); x selects weight 200.
	x := make([]float32, 256)
	x[200] = 1
	xb := uploadF32(t, d, x)
	yb := poisoned(t, d, 4*4)
	run(t, d, func(b *gpu.Batch) error { return k.Q4KMatVec(ctxT(t), b, w, xb, yb, 4, 256) })
	gy := readF32(t, d, yb, 4)
	for r := 0; r < 4; r++ {
		if gy[r] != want[r*256+200] {
			t.Errorf("row %d: got %v; want %v", r, gy[r], want[r*256+200])
		}
	}
}

func TestQ4KDequant(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, nb := range []int{1, 3, 32, 33, 257} {
		t.Run(fmt.Sprint(nb), func(t *testing.T) {
			blocks := randQ4K(r, nb)
			n := nb * 256
			want, err := ref.Q4K(blocks)
			if err != nil {
				t.Fatal(err)
			}
			w := upload(t, d, blocks)
			y := poisoned(t, d, n*4)
			yh := poisoned(t, d, n*2)
			run(t, d, func(b *gpu.Batch) error {
				if err := k.Q4KDequant(ctxT(t), b, abi.F32, w, y, n); err != nil {
					return err
				}
				return k.Q4KDequant(ctxT(t), b, abi.F16, w, yh, n)
			})
			if err := ref.Compare(readF32(t, d, y, n), want, nil, ref.Tolerance(ref.OpDequant)); err != nil {
				t.Errorf("f32: %v", err)
			}
			hs := make([]uint16, n)
			if err := d.Read(ctxT(t), yh, gpu.Bytes(hs)); err != nil {
				t.Fatal(err)
			}
			gh := make([]float32, n)
			for i, h := range hs {
				gh[i] = q4k.F16(h)
			}
			if err := ref.Compare(gh, want, nil, ref.Tolerance(ref.OpDequantF)); err != nil {
				t.Errorf("f16: %v", err)
			}
		})
	}
}

func TestQ4KMatMul(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	cases := []struct{ rows, cols, n int }{
		{1, 256, 1}, {3, 256, 1}, {7, 512, 1}, {33, 2304, 1}, {130, 1024, 1},
		{5, 14336, 1}, {2, 28672, 1}, {300, 768, 1}, // large K, odd blocks per row
		{3, 512, 2}, {17, 1280, 3}, {9, 256, 5}, {4, 2048, 9}, {65, 768, 8},
		{257, 4096, 1}, {300, 2304, 1}, {260, 14336, 1}, // the tuned configurations
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%dx%d/n%d", c.rows, c.cols, c.n), func(t *testing.T) {
			checkQ4K(t, d, k, r, c.rows, c.cols, c.n, DefaultQ4KConfig(c.rows, c.cols, c.n))
		})
	}
	// The configurations DefaultQ4KConfig picks for large shapes, on small
	// awkward ones.
	for _, cfg := range []Q4KConfig{
		DefaultQ4KConfig(4096, 14336, 1), DefaultQ4KConfig(14336, 4096, 1), DefaultQ4KConfig(7168, 2048, 1),
		DefaultQ4KConfig(2048, 2048*5, 1), DefaultQ4KConfig(16384, 2048, 1),
		DefaultQ4KConfig(6144, 4096, 1), DefaultQ4KConfig(4096, 4096, 1), DefaultQ4KConfig(2*14336, 4096, 1),
		DefaultQ4KConfig(2*4096, 14336, 1), DefaultQ4KConfig(32000, 4096, 1), DefaultQ4KConfig(1536, 7168, 1),
		{WG: 64, SPR: 2, Rows: 8, Pipeline: true}, {WG: 64, SPR: 4, Rows: 8, Pipeline: true},
	} {
		t.Run(fmt.Sprintf("default%+v", cfg), func(t *testing.T) {
			checkQ4K(t, d, k, r, 37, 4608, 1, cfg)
			checkQ4K(t, d, k, r, 3, 512, 1, cfg)
		})
	}
	// Every configuration the benchmarks may pick must be right too.
	for _, spr := range []int{1, 2, 4, 8, 16, 32} {
		for _, rows := range []int{1, 2, 4, 8, 16} {
			for v := 0; v < 5; v++ {
				cfg := Q4KConfig{SPR: spr, Rows: rows, Convert: spr == 4, Coalesced: v == 1, Pipeline: v == 2, Shifts: v == 3}
				if v == 4 || rows == 16 {
					cfg.WG = 64 << (spr % 2) // 64 or 128
					if spr > cfg.WG/8 {
						continue
					}
				}
				t.Run(fmt.Sprintf("cfg%d-%d-%d", spr, rows, v), func(t *testing.T) {
					checkQ4K(t, d, k, r, 37, 2560, 1, cfg)
					checkQ4K(t, d, k, r, 11, 768, 3, cfg)
					checkQ4K(t, d, k, r, 1, 256, 1, cfg)
				})
			}
		}
	}
}

// A group of products in one dispatch equals each product on its own:
// weights from arbitrary (repeated, unordered) arena slots, per-product or
// shared x, awkward shapes.
func TestQ4KMatVecGroup(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	cases := []struct {
		rows, cols int
		slots      []int
	}{
		{1, 256, []int{0}},
		{37, 512, []int{3, 0, 3, 4}},
		{300, 2560, []int{1, 2}},
		{5, 768, []int{4, 3, 2, 1, 0, 0, 1, 2, 3, 4, 4, 4, 0, 1, 2, 3}},
	}
	for _, c := range cases {
		for _, sharedX := range []bool{false, true} {
			for _, cfg := range []Q4KConfig{DefaultQ4KConfig(c.rows*len(c.slots), c.cols, 1), DefaultQ4KConfig(8*7168, 2048, 1), DefaultQ4KConfig(8*2048, 7168, 1), {SPR: 1, Rows: 1}} {
				t.Run(fmt.Sprintf("%dx%d/%d/shared%v/%+v", c.rows, c.cols, len(c.slots), sharedX, cfg), func(t *testing.T) {
					const nslots = 5
					per := c.rows * c.cols / 256
					arena := randQ4K(r, nslots*per)
					nx := len(c.slots)
					if sharedX {
						nx = 1
					}
					x := randF32(r, nx*c.cols, 1)
					var want, mag []float64
					for e, s := range c.slots {
						w64, err := ref.Q4K(arena[s*per*144 : (s+1)*per*144])
						if err != nil {
							t.Fatal(err)
						}
						xe := x
						if !sharedX {
							xe = x[e*c.cols : (e+1)*c.cols]
						}
						got, m := ref.MatMul(w64, ref.F32(xe), c.rows, c.cols, 1)
						want = append(want, got...)
						mag = append(mag, m...)
					}
					wb := upload(t, d, arena)
					xb := uploadF32(t, d, x)
					y := poisoned(t, d, len(c.slots)*c.rows*4)
					run(t, d, func(b *gpu.Batch) error {
						return k.Q4KMatVecGroupWith(ctxT(t), b, cfg, Group{Arena: wb, Slots: c.slots, X: xb, SharedX: sharedX, Y: y, Rows: c.rows, Cols: c.cols})
					})
					if err := ref.Compare(readF32(t, d, y, len(c.slots)*c.rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
						t.Fatal(err)
					}
				})
			}
		}
	}
	// Slots beyond the arena, and too many products, are refused.
	wb := upload(t, d, randQ4K(r, 2))
	xb := uploadF32(t, d, randF32(r, 256, 1))
	y := poisoned(t, d, 64)
	for _, slots := range [][]int{{2}, {-1}, make([]int, MaxGroup+1)} {
		b := d.Batch()
		k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: wb, Slots: slots, X: xb, SharedX: true, Y: y, Rows: 1, Cols: 256})
		if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
			t.Errorf("slots %v: %v; want gpu.ErrShape", slots, err)
		}
	}
}

func checkQ4K(t *testing.T, d *gpu.Device, k *Kernels, r *rand.Rand, rows, cols, n int, cfg Q4KConfig) {
	t.Helper()
	blocks := randQ4K(r, rows*cols/256)
	x := randF32(r, n*cols, 1)
	w64, err := ref.Q4K(blocks)
	if err != nil {
		t.Fatal(err)
	}
	want, mag := ref.MatMul(w64, ref.F32(x), rows, cols, n)
	w := upload(t, d, blocks)
	xb := uploadF32(t, d, x)
	y := poisoned(t, d, n*rows*4)
	run(t, d, func(b *gpu.Batch) error {
		return k.Q4KMatMulWith(ctxT(t), b, cfg, w, xb, y, MatShape{Rows: rows, Cols: cols, Tokens: n})
	})
	if err := ref.Compare(readF32(t, d, y, n*rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
		t.Fatalf("%dx%d n=%d %+v: %v", rows, cols, n, cfg, err)
	}
}

func TestDenseMatMul(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	cases := []struct{ rows, cols, n int }{
		{1, 1, 1}, {3, 5, 1}, {2, 257, 1}, {7, 1000, 1}, {1, 4096, 1}, {33, 8, 1},
		{5, 14336, 1}, {130, 64, 2}, {3, 7, 3}, {4, 96, 5}, {9, 1024, 8}, {2, 40, 9},
	}
	for _, dt := range []abi.DType{abi.F32, abi.F16} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%dx%d/n%d", dt, c.rows, c.cols, c.n), func(t *testing.T) {
				x := randF32(r, c.n*c.cols, 1)
				wf := randF32(r, c.rows*c.cols, 0.5)
				var wbytes []byte
				var w64 []float64
				if dt == abi.F16 {
					hs := make([]uint16, len(wf))
					for i, v := range wf {
						hs[i] = q4k.ToF16(v)
					}
					wbytes, w64 = gpu.Bytes(hs), ref.F16(hs)
				} else {
					wbytes, w64 = gpu.Bytes(wf), ref.F32(wf)
				}
				want, mag := ref.MatMul(w64, ref.F32(x), c.rows, c.cols, c.n)
				w := upload(t, d, wbytes)
				xb := uploadF32(t, d, x)
				y := poisoned(t, d, c.n*c.rows*4)
				run(t, d, func(b *gpu.Batch) error {
					return k.MatMul(ctxT(t), b, dt, w, xb, y, MatShape{Rows: c.rows, Cols: c.cols, Tokens: c.n})
				})
				if err := ref.Compare(readF32(t, d, y, c.n*c.rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestRMSNorm(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ n, dim int }{{1, 1}, {3, 7}, {2, 4096}, {5, 300}, {1, 7168}, {257, 33}} {
		t.Run(fmt.Sprintf("%dx%d", c.n, c.dim), func(t *testing.T) {
			x := randF32(r, c.n*c.dim, 3)
			w := randF32(r, c.dim, 1)
			const eps = 1e-5
			want := ref.RMSNorm(ref.F32(x), ref.F32(w), c.n, c.dim, eps)
			xb, wb := uploadF32(t, d, x), uploadF32(t, d, w)
			y := poisoned(t, d, c.n*c.dim*4)
			run(t, d, func(b *gpu.Batch) error {
				return k.RMSNorm(ctxT(t), b, xb, wb, y, NormShape{Rows: c.n, Dim: c.dim, Eps: eps})
			})
			if err := ref.Compare(readF32(t, d, y, c.n*c.dim), want, nil, ref.Tolerance(ref.OpRMSNorm)); err != nil {
				t.Fatal(err)
			}
			// WebGPU forbids one buffer bound read-only and read-write in a
			// dispatch: recording must say so instead of failing later.
			err := k.RMSNorm(ctxT(t), d.Batch(), xb, wb, xb, NormShape{Rows: c.n, Dim: c.dim, Eps: eps})
			if !errors.Is(err, gpu.ErrShape) {
				t.Fatalf("aliased x and y: err = %v; want gpu.ErrShape", err)
			}
		})
	}
}

func TestSoftmax(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct {
		n, dim int
		scale  float64
	}{{1, 1, 1}, {3, 7, 1}, {2, 4096, 4}, {5, 300, 20}, {1, 32000, 3}, {70, 8, 1}} {
		t.Run(fmt.Sprintf("%dx%d", c.n, c.dim), func(t *testing.T) {
			x := randF32(r, c.n*c.dim, c.scale)
			want := ref.Softmax(ref.F32(x), c.n, c.dim)
			xb := uploadF32(t, d, x)
			y := poisoned(t, d, c.n*c.dim*4)
			run(t, d, func(b *gpu.Batch) error { return k.Softmax(ctxT(t), b, xb, y, RowsShape{Rows: c.n, Dim: c.dim}) })
			if err := ref.Compare(readF32(t, d, y, c.n*c.dim), want, nil, ref.Tolerance(ref.OpSoftmax)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRope(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct {
		s     RopeShape
		theta float64
	}{
		{RopeShape{Tokens: 1, Heads: 1, HeadDim: 2, RotDim: 2, Pos0: 0}, 10000},
		{RopeShape{Tokens: 3, Heads: 5, HeadDim: 64, RotDim: 64, Pos0: 7}, 10000},
		{RopeShape{Tokens: 2, Heads: 4, HeadDim: 128, RotDim: 64, Pos0: 5000}, 1e6},
		{RopeShape{Tokens: 1, Heads: 32, HeadDim: 128, RotDim: 128, Pos0: 4095}, 500000},
		{RopeShape{Tokens: 9, Heads: 3, HeadDim: 10, RotDim: 6, Pos0: 100}, 10000},
	} {
		for _, style := range []abi.RopeStyle{abi.RopeNeoX, abi.RopeGPTJ} {
			s := c.s
			s.Style = style
			t.Run(fmt.Sprintf("%+v", s), func(t *testing.T) {
				n := s.Tokens * s.Heads * s.HeadDim
				x := randF32(r, n, 1)
				freqs := RopeFreqs(c.theta, s.RotDim)
				want := ref.Rope(ref.F32(x), s.Tokens, s.Heads, s.HeadDim, s.RotDim, s.Pos0,
					ref.RopeFreqs(c.theta, s.RotDim), abi.RopeStyle(style))
				// Error scale per element: the magnitude of its pair, grown
				// with the position (the f32 angle's rounding grows with it).
				scales := make([]float64, n)
				tol := ref.Tolerance(ref.OpRope)
				half := s.RotDim / 2
				for tk := 0; tk < s.Tokens; tk++ {
					grow := 1 + float64(s.Pos0+tk)*ref.RopePosTol/tol.Rel
					for h := 0; h < s.Heads; h++ {
						base := (tk*s.Heads + h) * s.HeadDim
						for i := 0; i < half; i++ {
							ia, ib := base+i, base+i+half
							if style == abi.RopeGPTJ {
								ia, ib = base+2*i, base+2*i+1
							}
							m := (math.Abs(float64(x[ia])) + math.Abs(float64(x[ib]))) * grow
							scales[ia], scales[ib] = m, m
						}
					}
				}
				xb := uploadF32(t, d, x)
				fb := uploadF32(t, d, freqs)
				run(t, d, func(b *gpu.Batch) error { return k.Rope(ctxT(t), b, xb, fb, s) })
				if err := ref.Compare(readF32(t, d, xb, n), want, scales, tol); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestAttention(t *testing.T) {
	for _, s := range []AttnShape{
		{Heads: 1, KVHeads: 1, HeadDim: 4, KVLen: 1},
		{Heads: 8, KVHeads: 2, HeadDim: 64, KVLen: 7},
		{Heads: 4, KVHeads: 4, HeadDim: 24, KVLen: 300},
		{Heads: 2, KVHeads: 2, HeadDim: 20, KVLen: 129},
		{Heads: 6, KVHeads: 1, HeadDim: 100, KVLen: 513},
		{Heads: 2, KVHeads: 1, HeadDim: 256, KVLen: 1000},
		{Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 256},
		// Chunk edges (32 positions a chunk; 16 and 64 below), eight query
		// heads a cache head, and a long cache.
		{Heads: 8, KVHeads: 2, HeadDim: 128, KVLen: 16},
		{Heads: 8, KVHeads: 2, HeadDim: 128, KVLen: 17},
		{Heads: 4, KVHeads: 1, HeadDim: 64, KVLen: 256},
		{Heads: 4, KVHeads: 1, HeadDim: 64, KVLen: 257},
		{Heads: 4, KVHeads: 2, HeadDim: 32, KVLen: 1024},
		{Heads: 4, KVHeads: 2, HeadDim: 32, KVLen: 1025},
		{Heads: 8, KVHeads: 1, HeadDim: 128, KVLen: 64},
		{Heads: 8, KVHeads: 1, HeadDim: 128, KVLen: 65},
		{Heads: 3, KVHeads: 3, HeadDim: 36, KVLen: 127},
		{Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 4096},
		// More than 8 query heads a cache head (DeepSeek-V3-shaped: 16),
		// and a count that is not a multiple of 8.
		{Heads: 128, KVHeads: 8, HeadDim: 128, KVLen: 70},
		{Heads: 12, KVHeads: 1, HeadDim: 64, KVLen: 200},
		// Many batches of the merge (each column's 32 groups load 256
		// chunks a batch, eight each).
		{Heads: 2, KVHeads: 1, HeadDim: 32, KVLen: 40000},
	} {
		// Every chunk size the kernel takes (attnChunk, the rule's, first).
		for _, ch := range []int{attnChunk, 16, 64} {
			s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
			t.Run(fmt.Sprintf("%+v/ch%d", s, ch), func(t *testing.T) {
				defer func(c int) { attnChunk = c }(attnChunk)
				attnChunk = ch
				testAttention(t, s)
			})
		}
	}
}

// TestAttentionLargeScores: scores of hundreds, whose exp overflows
// float32 unless each chunk's softmax and the merge subtract the true
// maximum (of the chunk, then of all chunks); an overflow (inf, NaN) or a
// wrong maximum misses the reference by O(1). The tolerance is 1e-4 plus
// what float32 scores of that size really cost: where two positions' scores
// are within a few units, both weigh, and a score off by a few ulps of its
// products' magnitude (~3000 here) moves the output by ~1e-4
// (attentionSensitivity). A flat 1e-4 failed 5 runs of 300, by up to 1.3x.
func TestAttentionLargeScores(t *testing.T) {
	for _, s := range []AttnShape{
		{Heads: 8, KVHeads: 2, HeadDim: 128, KVLen: 300},
		{Heads: 4, KVHeads: 1, HeadDim: 64, KVLen: 9000},
		{Heads: 6, KVHeads: 1, HeadDim: 100, KVLen: 513},
	} {
		s.Scale = 40
		t.Run(fmt.Sprintf("%+v", s), func(t *testing.T) {
			d, k := shared.d, shared.k
			r := rng(t)
			q := randF32(r, s.Heads*s.HeadDim, 1)
			kc := randF32(r, s.KVLen*s.KVHeads*s.HeadDim, 1)
			vc := randF32(r, s.KVLen*s.KVHeads*s.HeadDim, 1)
			qf, kf, vf := ref.F32(q), ref.F32(kc), ref.F32(vc)
			want := ref.Attention(qf, kf, vf, s.Heads, s.KVHeads, s.HeadDim, s.KVLen, float64(s.Scale))
			out := poisoned(t, d, s.Heads*s.HeadDim*4)
			qb, kb, vb := uploadF32(t, d, q), uploadF32(t, d, kc), uploadF32(t, d, vc)
			run(t, d, func(b *gpu.Batch) error { return k.Attention(ctxT(t), b, qb, kb, vb, out, s) })
			// 16 float32 ulps of sensitivity, 1e-4 besides.
			tol := ref.Tol{Abs: 1e-4, Rel: 16 * 0x1p-24}
			if err := ref.Compare(readF32(t, d, out, s.Heads*s.HeadDim), want, attentionSensitivity(qf, kf, vf, want, s), tol); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// attentionSensitivity is, for each output of attention (want, the
// reference's), how far it moves if every score moves by its magnitude's
// share (1 + scale * sum |q_d k_d|, float32 products and sums off by a few
// ulps of that): sum_t w_t |v_t - out| (1 + A_t), the softmax's derivative
// w_t (v_t - out) against each score.
func attentionSensitivity(q, k, v, want []float64, s AttnShape) []float64 {
	hd, group := s.HeadDim, s.Heads/s.KVHeads
	sens := make([]float64, len(want))
	sc, mag := make([]float64, s.KVLen), make([]float64, s.KVLen)
	for h := range s.Heads {
		kvh := h / group
		qh := q[h*hd : (h+1)*hd]
		m := math.Inf(-1)
		for t := range s.KVLen {
			kt := k[(t*s.KVHeads+kvh)*hd:]
			var dot, abs float64
			for i := range hd {
				dot += qh[i] * kt[i]
				abs += math.Abs(qh[i] * kt[i])
			}
			sc[t], mag[t] = dot*float64(s.Scale), 1+abs*float64(s.Scale)
			m = math.Max(m, sc[t])
		}
		var sum float64
		for t := range sc {
			sc[t] = math.Exp(sc[t] - m)
			sum += sc[t]
		}
		for t := range s.KVLen {
			vt := v[(t*s.KVHeads+kvh)*hd:]
			w := sc[t] / sum * mag[t]
			for i := range hd {
				sens[h*hd+i] += w * math.Abs(vt[i]-want[h*hd+i])
			}
		}
	}
	return sens
}

func testAttention(t *testing.T, s AttnShape) {
	d, k := shared.d, shared.k
	r := rng(t)
	q := randF32(r, s.Heads*s.HeadDim, 1)
	kc := randF32(r, s.KVLen*s.KVHeads*s.HeadDim, 1)
	vc := randF32(r, s.KVLen*s.KVHeads*s.HeadDim, 1)
	want := ref.Attention(ref.F32(q), ref.F32(kc), ref.F32(vc), s.Heads, s.KVHeads, s.HeadDim, s.KVLen, float64(s.Scale))
	qb, kb, vb := uploadF32(t, d, q), uploadF32(t, d, kc), uploadF32(t, d, vc)
	out := poisoned(t, d, s.Heads*s.HeadDim*4)
	live := d.Stats().LiveBuffers
	run(t, d, func(b *gpu.Batch) error { return k.Attention(ctxT(t), b, qb, kb, vb, out, s) })
	if n := d.Stats().LiveBuffers; n != live {
		t.Fatalf("%d buffers live after the batch, %d before: its scratch was not handed back", n, live)
	}
	if err := ref.Compare(readF32(t, d, out, s.Heads*s.HeadDim), want, nil, ref.Tolerance(ref.OpAttention)); err != nil {
		t.Fatal(err)
	}
}

func TestRoute(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct {
		name string
		s    RouteShape
		bias bool
	}{
		{"mixtral", RouteShape{Tokens: 3, Experts: 8, K: 2, Mode: abi.RouteSoftmaxTopK}, false},
		{"single", RouteShape{Tokens: 1, Experts: 1, K: 1, Mode: abi.RouteSoftmaxTopK}, false},
		{"wide", RouteShape{Tokens: 2, Experts: 1000, K: 5, Mode: abi.RouteSoftmaxTopK}, false},
		{"deepseek", RouteShape{Tokens: 4, Experts: 256, K: 8, Mode: abi.RouteSigmoidTopK, Groups: 8, TopKGroup: 4, Scale: 2.5}, true},
		{"sigmoid-nogroup", RouteShape{Tokens: 2, Experts: 64, K: 6, Mode: abi.RouteSigmoidTopK}, false},
		{"sigmoid-bias", RouteShape{Tokens: 5, Experts: 160, K: 6, Mode: abi.RouteSigmoidTopK, Groups: 1}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			logits := randF32(r, s.Tokens*s.Experts, 2)
			var bias []float32
			rr := ref.Route{Mode: abi.RouteMode(s.Mode), K: s.K, Groups: s.Groups, TopKGroup: s.TopKGroup, Scale: float64(s.Scale)}
			if c.bias {
				bias = randF32(r, s.Experts, 0.1)
				rr.Bias = ref.F32(bias)
			}
			// The reference widens the f32 logits; selection compares f32
			// scores on the GPU, so near-ties could order differently:
			// random normal logits make that vanishingly rare.
			wantIDs, wantW := ref.TopK(ref.F32(logits), s.Tokens, s.Experts, rr)
			lb := uploadF32(t, d, logits)
			var bb gpu.Region
			if c.bias {
				bb = uploadF32(t, d, bias)
			}
			ids := poisoned(t, d, s.Tokens*s.K*4)
			wts := poisoned(t, d, s.Tokens*s.K*4)
			run(t, d, func(b *gpu.Batch) error { return k.Route(ctxT(t), b, lb, bb, ids, wts, s) })
			gotIDs := readU32(t, d, ids, s.Tokens*s.K)
			for i := range wantIDs {
				if int(gotIDs[i]) != wantIDs[i] {
					t.Fatalf("ids: got %v; want %v", gotIDs, wantIDs)
				}
			}
			if err := ref.Compare(readF32(t, d, wts, s.Tokens*s.K), wantW, nil, ref.Tolerance(ref.OpRoute)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRouterRouteTies: two experts whose router rows are the same get
// the same logit to the bit, and the lower index is chosen first.
func TestRouterRouteTies(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const cols = 4096
	s := RouteShape{Tokens: 1, Experts: 8, K: 3, Mode: abi.RouteSoftmaxTopK}
	w, x := randF32(r, s.Experts*cols, 1/math.Sqrt(cols)), randF32(r, cols, 1)
	for i := range cols {
		// Rows 6 and 2: x / 64, a logit near |x|^2 / 64 (~21) above the
		// others (~1); row 6 written first so that the higher index is
		// not the first one filled.
		w[6*cols+i] = x[i] / 64
		w[2*cols+i] = x[i] / 64
	}
	wb, xb := uploadF32(t, d, w), uploadF32(t, d, x)
	logits, ids, wts := poisoned(t, d, s.Experts*4), poisoned(t, d, s.K*4), poisoned(t, d, s.K*4)
	run(t, d, func(b *gpu.Batch) error { return k.RouterRoute(ctxT(t), b, wb, xb, logits, nil, ids, wts, s, cols) })
	l := readF32(t, d, logits, s.Experts)
	if l[2] != l[6] {
		t.Fatalf("logits of the same rows differ: %v and %v", l[2], l[6])
	}
	if got := readU32(t, d, ids, s.K); got[0] != 2 || got[1] != 6 {
		t.Fatalf("ids %v; want 2 then 6 (a tie goes to the lower index)", got)
	}
}

// The router's product and the routing in one dispatch (route_mv) match
// the float64 reference of both: ids exactly, logits as a product.
func TestRouterRoute(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct {
		name string
		s    RouteShape
		cols int
		bias bool
	}{
		{"mixtral", RouteShape{Tokens: 1, Experts: 8, K: 2, Mode: abi.RouteSoftmaxTopK}, 4096, false},
		{"single", RouteShape{Tokens: 1, Experts: 1, K: 1, Mode: abi.RouteSoftmaxTopK}, 4, false},
		{"odd", RouteShape{Tokens: 1, Experts: 3, K: 2, Mode: abi.RouteSoftmaxTopK}, 36, false},
		{"short-rows", RouteShape{Tokens: 1, Experts: 5, K: 1, Mode: abi.RouteSoftmaxTopK}, 1000, false},
		{"sigmoid-bias", RouteShape{Tokens: 1, Experts: 16, K: 4, Mode: abi.RouteSigmoidTopK, Scale: 2.5}, 1024, true},
		{"sigmoid-groups", RouteShape{Tokens: 1, Experts: 16, K: 3, Mode: abi.RouteSigmoidTopK, Groups: 4, TopKGroup: 2}, 512, false},
		{"all-of-16", RouteShape{Tokens: 1, Experts: 16, K: 16, Mode: abi.RouteSoftmaxTopK}, 256, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			rr := ref.Route{Mode: abi.RouteMode(s.Mode), K: s.K, Groups: s.Groups, TopKGroup: s.TopKGroup, Scale: float64(s.Scale)}
			var bias []float32
			if c.bias {
				bias = randF32(r, s.Experts, 0.1)
				rr.Bias = ref.F32(bias)
			}
			var w, x []float32
			want, mag := untied(func() ([]float64, []float64) {
				// Logits of about unit size: sigmoid would saturate to
				// ties at 1 in f32 on larger ones.
				w, x = randF32(r, s.Experts*c.cols, 1/math.Sqrt(float64(c.cols))), randF32(r, c.cols, 1)
				return ref.MatMul(ref.F32(w), ref.F32(x), s.Experts, c.cols, 1)
			})
			wb, xb := uploadF32(t, d, w), uploadF32(t, d, x)
			var bb gpu.Region
			if c.bias {
				bb = uploadF32(t, d, bias)
			}
			checkRouter(t, d, s, rr, want, mag, func(b *gpu.Batch, logits, ids, wts gpu.Region) error {
				return k.RouterRoute(ctxT(t), b, wb, xb, logits, bb, ids, wts, s, c.cols)
			})
		})
	}
	// Shapes it refuses: several tokens, too many experts, ragged rows.
	for _, bad := range []struct {
		s    RouteShape
		cols int
	}{
		{RouteShape{Tokens: 2, Experts: 8, K: 2}, 4096},
		{RouteShape{Tokens: 1, Experts: 17, K: 2}, 4096},
		{RouteShape{Tokens: 1, Experts: 8, K: 2}, 4094},
	} {
		if _, err := RouterRouteLaunch(bad.s, bad.cols, false); err == nil {
			t.Errorf("RouterRouteLaunch(%+v, %d) accepted", bad.s, bad.cols)
		}
	}
}

// The router of the FFN's RMSNorm of x + o in one dispatch
// (route_mv_norm) matches the float64 reference of the norm, the
// product and the routing: ids exactly, logits as a product of the norm.
func TestRouterRouteNorm(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const eps = 1e-5
	for _, c := range []struct {
		name string
		s    RouteShape
		cols int
	}{
		{"mixtral", RouteShape{Tokens: 1, Experts: 8, K: 2, Mode: abi.RouteSoftmaxTopK}, 4096},
		{"single", RouteShape{Tokens: 1, Experts: 1, K: 1, Mode: abi.RouteSoftmaxTopK}, 16},
		{"odd", RouteShape{Tokens: 1, Experts: 3, K: 2, Mode: abi.RouteSoftmaxTopK}, 48},
		{"ragged-groups", RouteShape{Tokens: 1, Experts: 5, K: 3, Mode: abi.RouteSoftmaxTopK}, 1008},
		{"tiny-moe", RouteShape{Tokens: 1, Experts: 4, K: 2, Mode: abi.RouteSoftmaxTopK}, 256},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			rr := ref.Route{Mode: abi.RouteMode(s.Mode), K: s.K, Scale: 1}
			var w, x, o, g []float32
			want, mag := untied(func() ([]float64, []float64) {
				w, x, o = randF32(r, s.Experts*c.cols, 1/math.Sqrt(float64(c.cols))), randF32(r, c.cols, 1), randF32(r, c.cols, 0.5)
				g = randF32(r, c.cols, 1)
				v := make([]float64, c.cols)
				for i := range v {
					v[i] = float64(x[i] + o[i]) // the accumulate's f32 sum
				}
				xn := ref.RMSNorm(v, ref.F32(g), 1, c.cols, eps)
				return ref.MatMul(ref.F32(w), xn, s.Experts, c.cols, 1)
			})
			wb, xb, ob, gb := uploadF32(t, d, w), uploadF32(t, d, x), uploadF32(t, d, o), uploadF32(t, d, g)
			checkRouter(t, d, s, rr, want, mag, func(b *gpu.Batch, logits, ids, wts gpu.Region) error {
				return k.RouterRouteNorm(ctxT(t), b, wb, xb, ob, gb, logits, ids, wts, s, c.cols, eps)
			})
		})
	}
	// Shapes it refuses: several tokens, too many experts, ragged groups
	// or rows past a thread a group.
	for _, bad := range []struct {
		s    RouteShape
		cols int
	}{
		{RouteShape{Tokens: 2, Experts: 8, K: 2}, 4096},
		{RouteShape{Tokens: 1, Experts: 9, K: 2}, 4096},
		{RouteShape{Tokens: 1, Experts: 8, K: 2}, 4088},
		{RouteShape{Tokens: 1, Experts: 8, K: 2}, 4112},
	} {
		if _, err := RouterRouteNormLaunch(bad.s, bad.cols, eps); err == nil {
			t.Errorf("RouterRouteNormLaunch(%+v, %d) accepted", bad.s, bad.cols)
		}
	}
}

// untied draws until the reference's logits are not near-ties (the GPU
// sums in another order; a tie within its rounding could pick either),
// at most 101 times, and returns the last draw's logits and magnitudes.
func untied(draw func() (want, mag []float64)) ([]float64, []float64) {
	for try := 0; ; try++ {
		want, mag := draw()
		if apart(want, mag, 1e-4) || try == 100 {
			return want, mag
		}
	}
}

// checkRouter runs a router (record, into poisoned logits, ids and
// weights of shape s) and compares its logits (as a product, with their
// magnitudes mag), ids (exactly) and weights with the reference's
// routing rr of want.
func checkRouter(t *testing.T, d *gpu.Device, s RouteShape, rr ref.Route, want, mag []float64, record func(b *gpu.Batch, logits, ids, wts gpu.Region) error) {
	t.Helper()
	wantIDs, wantW := ref.TopK(want, 1, s.Experts, rr)
	logits := poisoned(t, d, s.Experts*4)
	ids := poisoned(t, d, s.K*4)
	wts := poisoned(t, d, s.K*4)
	run(t, d, func(b *gpu.Batch) error { return record(b, logits, ids, wts) })
	if err := ref.Compare(readF32(t, d, logits, s.Experts), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
		t.Fatalf("logits: %v", err)
	}
	if got := readU32(t, d, ids, s.K); fmt.Sprint(got) != fmt.Sprint(wantIDs) {
		t.Fatalf("ids: got %v; want %v", got, wantIDs)
	}
	if err := ref.Compare(readF32(t, d, wts, s.K), wantW, nil, ref.Tolerance(ref.OpRoute)); err != nil {
		t.Fatal(err)
	}
}

// apart reports whether no two values of v are closer than rel times the
// larger of their scales.
func apart(v, scale []float64, rel float64) bool {
	for i := range v {
		for j := range i {
			if math.Abs(v[i]-v[j]) < rel*math.Max(scale[i], scale[j]) {
				return false
			}
		}
	}
	return true
}

func TestSwiGLU(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, n := range []int{1, 257, 14336, 70000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g, u := randF32(r, n, 3), randF32(r, n, 1)
			want := ref.SwiGLU(ref.F32(g), ref.F32(u))
			gb, ub := uploadF32(t, d, g), uploadF32(t, d, u)
			y := poisoned(t, d, n*4)
			run(t, d, func(b *gpu.Batch) error { return k.SwiGLU(ctxT(t), b, gb, ub, y, n) })
			if err := ref.Compare(readF32(t, d, y, n), want, nil, ref.Tolerance(ref.OpSwiGLU)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestAccumulate(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ k, dim, off int }{{1, 1, 0}, {2, 300, 0}, {8, 4096, 3}, {3, 7, 1}} {
		t.Run(fmt.Sprintf("%d/%d/%d", c.k, c.dim, c.off), func(t *testing.T) {
			src := randF32(r, c.k*c.dim, 1)
			w := randF32(r, c.off+c.k, 1)
			dst := randF32(r, c.dim, 1)
			mag := make([]float64, c.dim)
			for i := range mag {
				mag[i] = math.Abs(float64(dst[i]))
				for j := 0; j < c.k; j++ {
					mag[i] += math.Abs(float64(w[c.off+j] * src[j*c.dim+i]))
				}
			}
			want := ref.Accumulate(ref.F32(dst), ref.F32(src), ref.F32(w[c.off:]), c.k, c.dim)
			sb, wb, db := uploadF32(t, d, src), uploadF32(t, d, w), uploadF32(t, d, dst)
			run(t, d, func(b *gpu.Batch) error {
				return k.Accumulate(ctxT(t), b, sb, wb, db, AccumShape{Experts: c.k, Dim: c.dim, WeightOff: c.off})
			})
			if err := ref.Compare(readF32(t, d, db, c.dim), want, mag, ref.Tolerance(ref.OpAccum)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestEmbed(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, dt := range []abi.DType{abi.F32, abi.F16, abi.Q4K} {
		for _, c := range []struct{ vocab, dim, n int }{{1, 256, 1}, {37, 512, 3}, {1000, 768, 5}} {
			dim := c.dim
			if dt != abi.Q4K {
				dim = c.dim - 1 // odd rows for f16
			}
			t.Run(fmt.Sprintf("%v/%dx%d/n%d", dt, c.vocab, dim, c.n), func(t *testing.T) {
				var table []byte
				var t64 []float64
				switch dt {
				case abi.F32:
					f := randF32(r, c.vocab*dim, 1)
					table, t64 = gpu.Bytes(f), ref.F32(f)
				case abi.F16:
					hs := make([]uint16, c.vocab*dim)
					for i := range hs {
						hs[i] = q4k.ToF16(float32(r.NormFloat64()))
					}
					table, t64 = gpu.Bytes(hs), ref.F16(hs)
				case abi.Q4K:
					table = randQ4K(r, c.vocab*dim/256)
					t64, _ = ref.Q4K(table)
				}
				ids := make([]uint32, c.n)
				iids := make([]int, c.n)
				for i := range ids {
					ids[i] = uint32(r.IntN(c.vocab))
					iids[i] = int(ids[i])
				}
				want := ref.Embed(t64, iids, dim)
				tb, ib := upload(t, d, table), upload(t, d, gpu.Bytes(ids))
				y := poisoned(t, d, c.n*dim*4)
				run(t, d, func(b *gpu.Batch) error {
					return k.Embed(ctxT(t), b, tb, ib, y, EmbedShape{Type: dt, Tokens: c.n, Dim: dim, Vocab: c.vocab})
				})
				tol := ref.Tolerance(ref.OpEmbed)
				if dt == abi.Q4K {
					tol = ref.Tolerance(ref.OpDequant)
				}
				if err := ref.Compare(readF32(t, d, y, c.n*dim), want, nil, tol); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestArgmax(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, n := range []int{1, 7, 256, 257, 4096, 4097, 100003, 152064} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			x := randF32(r, n, 1)
			if n > 10 {
				// A tie at the maximum: the lower index must win, also
				// when the two are in different blocks of the first pass;
				// NaNs are skipped.
				m := float32(10)
				x[n/2], x[n/3] = m, m
				x[n-1] = float32(math.NaN())
				x[0] = float32(math.NaN())
			}
			if n > 8192 {
				for i := 4096; i < 8192; i++ {
					x[i] = float32(math.NaN()) // a block of NaNs
				}
			}
			want := ref.Argmax(ref.F32(x))
			xb := uploadF32(t, d, x)
			out := poisoned(t, d, 4)
			run(t, d, func(b *gpu.Batch) error { return k.Argmax(ctxT(t), b, xb, out, n) })
			if got := readU32(t, d, out, 1)[0]; int(got) != want {
				t.Fatalf("argmax = %d; want %d", got, want)
			}
		})
	}
}

// TestTopPBlocks runs top-p over vocabularies of several blocks whose
// mass sits in a head of tokens spread over the vocabulary (boosted
// logits), so that the kept set holds tens to hundreds of tokens with
// probabilities far from f32's rounding: the draw's pick crosses blocks
// and every case is decided, not skipped.
func TestTopPBlocks(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	checked := 0
	for _, c := range []struct {
		n, head     int
		temp, top_p float64
	}{{151936, 300, 1, 0.9}, {100000, 60, 0.7, 0.8}, {8193, 40, 1.2, 0.95}, {65536, 1000, 1, 0.5}} {
		for it := 0; it < 4; it++ {
			x := randF32(r, c.n, 1)
			for range c.head {
				x[r.IntN(c.n)] += 12
			}
			u := r.Float64()
			want, margin := ref.TopP(ref.F32(x), c.temp, c.top_p, u)
			if margin < 1e-4 {
				continue
			}
			checked++
			xb := uploadF32(t, d, x)
			out := poisoned(t, d, 4)
			run(t, d, func(b *gpu.Batch) error {
				return k.TopP(ctxT(t), b, xb, out, TopPShape{N: c.n, Temperature: float32(c.temp), TopP: float32(c.top_p), U: float32(u)})
			})
			if got := readU32(t, d, out, 1)[0]; int(got) != want {
				t.Fatalf("n %d head %d temp %v top-p %v u %v: got token %d; want %d (margin %.3g)", c.n, c.head, c.temp, c.top_p, u, got, want, margin)
			}
		}
	}
	if checked < 12 {
		t.Fatalf("only %d of 16 cases had a safe margin", checked)
	}
}

// TestTopPAwkward runs top-p over inputs built to hit the kernel's
// corners rather than its common path: every logit equal (one tie holds
// the whole vocabulary and the last radix round's bucket), a tie that
// straddles top-p, top-p 1 (the first round keeps every token), u = 0, a
// tiny and a huge temperature, sizes that are not multiples of a block,
// under one block, and past 64 blocks (ops.TopPLaunches widens the
// blocks).
// Each case draws its logits and u until the reference's decision has a
// safe margin.
func TestTopPAwkward(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	head := func(x []float32, n int, lift float32) {
		for range n {
			x[r.IntN(len(x))] += lift
		}
	}
	for _, c := range []struct {
		name        string
		n           int
		temp, top_p float64
		make        func(n int) []float32
	}{
		{"equal", 4500, 1, 0.9, func(n int) []float32 {
			x := make([]float32, n)
			for i := range x {
				x[i] = 0.25
			}
			return x
		}},
		// 2^31 / 4992 rounds down: the fixed-point masses sum below top-p
		// 1's goal, and the first round keeps every token.
		{"equal-top-p-1", 4992, 0.7, 1, func(n int) []float32 { return make([]float32, n) }},
		{"tie-straddles", 20000, 1, 0.6, func(n int) []float32 {
			// 12 tokens tied at the top hold about 0.8 of the mass.
			x := randF32(r, n, 1)
			for range 12 {
				x[r.IntN(n)] = 13
			}
			return x
		}},
		{"ties-spread", 152064, 1, 0.9, func(n int) []float32 {
			// A head of 200 logits from 8 values: ties across blocks.
			x := randF32(r, n, 1)
			for range 200 {
				x[r.IntN(n)] = 10 + float32(r.IntN(8))
			}
			return x
		}},
		{"top-p-1", 152064, 1, 1, func(n int) []float32 {
			// A head that holds most of the mass over a tail whose
			// smallest probabilities sit in the first half: dropping any
			// of them moves the draw's target past the head's tokens
			// after it (dropped evenly, they would move the goal alike).
			x := randF32(r, n, 1)
			for i := range n / 2 {
				x[i] -= 3
			}
			head(x, 300, 8)
			return x
		}},
		{"tiny-temperature", 152064, 0.01, 0.9, func(n int) []float32 { return randF32(r, n, 1) }},
		{"tiny-temperature-tied-max", 100003, 0.001, 0.9, func(n int) []float32 {
			x := randF32(r, n, 1)
			x[r.IntN(n)], x[r.IntN(n)] = 9, 9
			return x
		}},
		{"huge-temperature", 1000, 50, 0.9, func(n int) []float32 { return randF32(r, n, 1) }},
		{"huge-temperature-blocks", 20000, 1000, 0.95, func(n int) []float32 {
			// Logits a thousand times a head-and-bulk's: the temperature
			// brings them back, through an inverse of 1e-3.
			x := randF32(r, n, 1000)
			head(x, 50, 12000)
			return x
		}},
		{"u-zero", 152064, 1, 0.9, func(n int) []float32 {
			x := randF32(r, n, 1)
			head(x, 300, 14)
			return x
		}},
		{"under-a-block", 3000, 0.8, 0.9, func(n int) []float32 {
			x := randF32(r, n, 1)
			head(x, 40, 9)
			return x
		}},
		{"wide-blocks", 300007, 1, 0.9, func(n int) []float32 {
			x := randF32(r, n, 1)
			head(x, 300, 15)
			return x
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var x []float32
			var u float64
			want, margin := -1, 0.0
			for try := 0; margin < 1e-4; try++ {
				if try == 60 {
					t.Fatalf("no draw in %d gives a safe margin (last %.3g): fix the case", try, margin)
				}
				if try%3 == 0 { // a few u for each x
					x = c.make(c.n)
				}
				u = r.Float64()
				if c.name == "u-zero" {
					u = 0 // the first kept token
				}
				if strings.HasPrefix(c.name, "equal") {
					// The middle of a token of the second block: every
					// one holds 1/n.
					u = (float64(4096+r.IntN(c.n-4096)) + 0.5) / float64(c.n)
				}
				want, margin = ref.TopP(ref.F32(x), c.temp, c.top_p, u)
			}
			xb := uploadF32(t, d, x)
			out := poisoned(t, d, 4)
			run(t, d, func(b *gpu.Batch) error {
				return k.TopP(ctxT(t), b, xb, out, TopPShape{N: c.n, Temperature: float32(c.temp), TopP: float32(c.top_p), U: float32(u)})
			})
			if got := readU32(t, d, out, 1)[0]; int(got) != want {
				t.Fatalf("u %v: got token %d; want %d (margin %.3g)", u, got, want, margin)
			}
		})
	}
}

func TestTopP(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	checked := 0
	for _, c := range []struct {
		n           int
		scale       float64
		temp, top_p float64
	}{
		{1, 1, 1, 0.9}, {10, 2, 1, 0.5}, {1000, 3, 0.8, 0.9}, {32000, 4, 1, 0.95}, {5000, 1, 1.5, 1}, {300, 5, 0.7, 0.1},
		// More than one block (topp_blocks): a vocabulary, a flat one
		// that keeps most of it, a sharp one that keeps a few, and a
		// block and one value. Most draws over a large vocabulary fall
		// within f32's reach of a boundary and are skipped: the cases
		// below (TestTopPBlocks) are built to be decided.
		{151936, 3, 0.8, 0.9}, {100000, 0.1, 1, 0.99}, {65536, 8, 0.5, 0.5}, {4097, 2, 1, 0.7},
	} {
		for it := 0; it < 4; it++ {
			x := randF32(r, c.n, c.scale)
			u := r.Float64()
			want, margin := ref.TopP(ref.F32(x), c.temp, c.top_p, u)
			if margin < 1e-4 && c.n > 1 {
				continue // too close to a boundary for f32 to decide like f64
			}
			checked++
			xb := uploadF32(t, d, x)
			out := poisoned(t, d, 4)
			run(t, d, func(b *gpu.Batch) error {
				return k.TopP(ctxT(t), b, xb, out, TopPShape{N: c.n, Temperature: float32(c.temp), TopP: float32(c.top_p), U: float32(u)})
			})
			if got := readU32(t, d, out, 1)[0]; int(got) != want {
				t.Fatalf("n %d temp %v top-p %v u %v: got token %d; want %d (margin %.3g)", c.n, c.temp, c.top_p, u, got, want, margin)
			}
		}
	}
	if checked < 12 {
		t.Fatalf("only %d cases had a safe margin", checked)
	}
}
