package ops

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ref"
)

// unpackXQ returns the values that n values of x in QuantizeX's form
// stand for (integer times scale), checking each group's sum word.
func unpackXQ(t *testing.T, raw []byte, n int) []float64 {
	t.Helper()
	out := make([]float64, n)
	for g := range n / XQGroup {
		w := func(i int) uint32 { return binary.LittleEndian.Uint32(raw[g*48+4*i:]) }
		scale := float64(math.Float32frombits(w(8)))
		sum := float64(math.Float32frombits(w(9)))
		qsum := 0.0
		for k := range 4 {
			for pair, word := range [2]uint32{w(k), w(4 + k)} {
				lo := int32(int16(word))       // value 4k + 2 + pair
				hi := (int32(word) - lo) >> 16 // value 4k + pair
				for _, v := range []struct {
					i int
					q int32
				}{{4*k + pair, hi}, {4*k + 2 + pair, lo}} {
					if v.q < -127 || v.q > 127 {
						t.Fatalf("group %d value %d: %d is outside [-127, 127]", g, v.i, v.q)
					}
					out[g*XQGroup+v.i] = float64(v.q) * scale
					qsum += float64(v.q)
				}
			}
		}
		if math.Abs(sum-qsum*scale) > 1e-6*math.Abs(qsum*scale)+1e-30 {
			t.Fatalf("group %d: sum word %g; its values add to %g", g, sum, qsum*scale)
		}
	}
	return out
}

// readXQ reads n values in QuantizeX's form from q and returns what they
// stand for (unpackXQ).
func readXQ(t *testing.T, d *gpu.Device, q gpu.Region, n int) []float64 {
	t.Helper()
	raw := make([]byte, XQBytes(n))
	if err := d.Read(ctxT(t), q, raw); err != nil {
		t.Fatal(err)
	}
	return unpackXQ(t, raw, n)
}

// groupStep is the quantization step of value i's group of vals: its
// largest magnitude / 127.
func groupStep(vals []float32, i int) float64 {
	step := 0.0
	for _, v := range vals[i/XQGroup*XQGroup : (i/XQGroup+1)*XQGroup] {
		step = math.Max(step, math.Abs(float64(v))/127)
	}
	return step
}

// withinStep fails unless got and want, two quantized forms of vals, are
// at most one step of each value's group apart.
func withinStep(t *testing.T, what string, vals []float32, got, want []float64) {
	t.Helper()
	for i := range got {
		if math.Abs(got[i]-want[i]) > groupStep(vals, i)*1.0001 {
			t.Fatalf("%s: value %d (%g) quantized to %g; want %g", what, i, vals[i], got[i], want[i])
		}
	}
}

// QuantizeX on the GPU gives ref.QuantizeX's values (one step off at
// most, in the rare value where the GPU's division rounds otherwise), and
// the _xq products of what it wrote equal float64 products of those values:
// plain groups, gate and up together, masked with the router's choice on
// the GPU, shared and per-product x, every thread layout the policy picks.
func TestQ4KXQ(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	yqs := 0 // masked cases with their output quantized
	// The Mixtral-shaped gate and up of quantized x take groupConfig's
	// own layout (its kernel runs below as cfgs' last), which hands its
	// output over quantized.
	mix := groupConfig(2*14336, 4096, true)
	if mix != (Q4KConfig{WG: 128, SPR: 2, Rows: 8, Pipeline: true}) || !GLUQuantizesY(14336, 4096, 2) {
		t.Fatalf("gate and up of quantized x, 2 x 14336 x 4096: %+v, output quantized %v", mix, GLUQuantizesY(14336, 4096, 2))
	}
	// 48 rows: a last workgroup of 32 output rows holds one group.
	for _, c := range []struct{ rows, cols int }{{37, 512}, {300, 4096}, {300, 2048}, {5, 256}, {64, 512}, {320, 2048}, {48, 512}} {
		rows, cols := c.rows, c.cols
		ab, arena, matrix := q4kArena(t, d, r, 5, rows, cols)
		per := rows * cols / 256
		// Two vectors of x, the second group of the first all zeros and one
		// value of the third large (a group's scale from one value).
		xs := randF32(r, 2*cols, 1)
		clear(xs[XQGroup : 2*XQGroup])
		xs[2*XQGroup+5] = 300
		xb := uploadF32(t, d, xs)
		qb := poisoned(t, d, int(2*XQBytes(cols)))
		run(t, d, func(b *gpu.Batch) error {
			if err := k.QuantizeX(ctxT(t), b, xb.Sub(0, uint64(cols*4)), qb.Sub(0, XQBytes(cols)), cols); err != nil {
				return err
			}
			return k.QuantizeX(ctxT(t), b, xb.Sub(uint64(cols*4), uint64(cols*4)), qb.Sub(XQBytes(cols), XQBytes(cols)), cols)
		})
		xt := readXQ(t, d, qb, 2*cols)
		want := ref.QuantizeX(ref.F32(xs))
		withinStep(t, "x", xs, xt, want)
		off := 0
		for i := range xt {
			// The scale itself may be a float32 step off (a GPU's division).
			if math.Abs(xt[i]-want[i]) > 1e-6*127*groupStep(xs, i) {
				off++
			}
		}
		if off > len(xt)/100 {
			t.Fatalf("%d of %d values one step from ref.QuantizeX's", off, len(xt))
		}
		for _, v := range xt[XQGroup : 2*XQGroup] {
			if v != 0 {
				t.Fatalf("a group of zeros quantized to %v", xt[XQGroup:2*XQGroup])
			}
		}
		x0, x1 := xt[:cols], xt[cols:]
		product := func(slot int, x []float64) ([]float64, []float64) { return ref.MatMul(matrix(slot), x, rows, cols, 1) }
		glu := func(gate, up int, x []float64) (want, mag []float64) {
			g, gm := product(gate, x)
			u, um := product(up, x)
			return gluRef(g, gm, u, um)
		}
		cat := func(parts ...[]float64) []float64 {
			var out []float64
			for _, p := range parts {
				out = append(out, p...)
			}
			return out
		}
		check := func(what string, y gpu.Region, want, mag []float64) {
			t.Helper()
			if err := ref.Compare(readF32(t, d, y, len(want)), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
				t.Fatalf("%dx%d, %s: %v", rows, cols, what, err)
			}
		}
		// yqSlack is what checkYQ's buffers hold past the output: two
		// groups, so that a write past the last row shows.
		yqSlack := 2 * XQBytes(XQGroup)
		// checkYQ checks that yq holds n values of y as QuantizeX writes
		// them, byte for byte (the same quantize on the same floats), and
		// nothing past them.
		checkYQ := func(what string, y, yq gpu.Region, n int) {
			t.Helper()
			want := poisoned(t, d, int(XQBytes(n)+yqSlack))
			run(t, d, func(b *gpu.Batch) error { return k.QuantizeX(ctxT(t), b, y, want.Sub(0, XQBytes(n)), n) })
			a, b := make([]byte, XQBytes(n)+yqSlack), make([]byte, XQBytes(n)+yqSlack)
			if err := d.Read(ctxT(t), yq, a); err != nil {
				t.Fatal(err)
			}
			if err := d.Read(ctxT(t), want, b); err != nil {
				t.Fatal(err)
			}
			for i := range a {
				if a[i] != b[i] {
					t.Fatalf("%dx%d, %s: quantized output byte %d (of %d) is %#x; QuantizeX of the output wrote %#x", rows, cols, what, i, XQBytes(n), a[i], b[i])
				}
			}
		}
		cfgs := []Q4KConfig{DefaultQ4KConfig(2*rows, cols, 1), DefaultQ4KConfig(8*7168, 2048, 1), {SPR: 1, Rows: 2}, {WG: 64, SPR: 2, Rows: 4, Pipeline: true}, mix}
		for _, cfg := range cfgs {
			name := fmt.Sprintf("%+v", cfg)
			// Plain group: slots 3 and 1 of x0 and x1.
			y := poisoned(t, d, 2*rows*4)
			run(t, d, func(b *gpu.Batch) error {
				return k.Q4KMatVecGroupWith(ctxT(t), b, cfg, Group{Arena: ab, Slots: []int{3, 1}, X: qb, Y: y, Rows: rows, Cols: cols, XQ: true})
			})
			w3, m3 := product(3, x0)
			w1, m1 := product(1, x1)
			check(name+" group", y, cat(w3, w1), cat(m3, m1))
			// Gate and up together, shared x.
			run(t, d, func(b *gpu.Batch) error {
				return k.Q4KMatVecGroupWith(ctxT(t), b, cfg, Group{Arena: ab, Slots: []int{4, 0}, UpSlots: []int{2, 2}, X: qb, SharedX: true, Y: y, Rows: rows, Cols: cols, XQ: true})
			})
			g0, gm0 := glu(4, 2, x0)
			g1, gm1 := glu(0, 2, x0)
			check(name+" GLU group", y, cat(g0, g1), cat(gm0, gm1))
			// And its output quantized too, where the layout allows.
			grp := Group{Arena: ab, Slots: []int{4, 0}, UpSlots: []int{2, 2}, X: qb, SharedX: true, Y: y, Rows: rows, Cols: cols, XQ: true}
			yq := poisoned(t, d, int(XQBytes(2*rows)+yqSlack))
			grp.YQ = yq
			if !gluYQ(cfg, rows) {
				b := d.Batch()
				k.Q4KMatVecGroupWith(ctxT(t), b, cfg, grp)
				if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
					t.Errorf("%dx%d %s: quantized output of rows that are not whole groups a workgroup: %v; want gpu.ErrShape", rows, cols, name, err)
				}
				continue
			}
			y2 := poisoned(t, d, 2*rows*4)
			grp.Y = y2
			run(t, d, func(b *gpu.Batch) error { return k.Q4KMatVecGroupWith(ctxT(t), b, cfg, grp) })
			check(name+" GLU group, output quantized", y2, cat(g0, g1), cat(gm0, gm1))
			checkYQ(name+" GLU group", y2, yq, 2*rows)
		}
		// One plain product of x1 (not grouped), every layout above.
		w2b := upload(t, d, arena[2*per*144:3*per*144])
		for _, cfg := range append(cfgs, DefaultQ4KConfig(rows, cols, 1)) {
			y1 := poisoned(t, d, rows*4)
			run(t, d, func(b *gpu.Batch) error {
				return k.Q4KMatVecXQWith(ctxT(t), b, cfg, w2b, qb.Sub(XQBytes(cols), XQBytes(cols)), y1, rows, cols)
			})
			w2, m2 := product(2, x1)
			check(fmt.Sprintf("%+v plain", cfg), y1, w2, m2)
		}
		// Masked, the router's choice (experts 2 then 0) on the GPU: gate and
		// up of a shared x, and products of each chosen expert's own x.
		sel := upload(t, d, gpu.Bytes([]uint32{2, 0}))
		y := poisoned(t, d, 2*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: []int{1, 3, 4}, UpSlots: []int{0, 2, 1}, Experts: []int{0, 1, 2}, Sel: sel, K: 2, X: qb, SharedX: true, Y: y, Rows: rows, Cols: cols, XQ: true})
		})
		g2, gm2 := glu(4, 1, x0)
		g0, gm0 := glu(1, 0, x0)
		check("masked GLU", y, cat(g2, g0), cat(gm2, gm0))
		if GLUQuantizesY(rows, cols, 2) {
			yq := poisoned(t, d, int(XQBytes(2*rows)+yqSlack))
			run(t, d, func(b *gpu.Batch) error {
				return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: []int{1, 3, 4}, UpSlots: []int{0, 2, 1}, Experts: []int{0, 1, 2}, Sel: sel, K: 2, X: qb, SharedX: true, Y: y, Rows: rows, Cols: cols, XQ: true, YQ: yq})
			})
			check("masked GLU, output quantized", y, cat(g2, g0), cat(gm2, gm0))
			checkYQ("masked GLU", y, yq, 2*rows)
			yqs++
		}
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: []int{1, 3, 4}, Experts: []int{0, 1, 2}, Sel: sel, K: 2, X: qb, Y: y, Rows: rows, Cols: cols, XQ: true})
		})
		w4, m4 := product(4, x0)
		w1, m1 := product(1, x1)
		check("masked", y, cat(w4, w1), cat(m4, m1))
		// Quantized x with SwiGLU's input or a norm handed over is refused.
		for _, bad := range []func(b *gpu.Batch) error{
			func(b *gpu.Batch) error {
				return k.Q4KMatVecMaskedSwiGLU(ctxT(t), b, Masked{Arena: ab, Slots: []int{1}, Experts: []int{0}, Sel: sel, K: 1, X: qb, Y: y, Rows: rows, Cols: cols, XQ: true}, cols*4)
			},
			func(b *gpu.Batch) error {
				return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: []int{1}, Experts: []int{0}, Sel: sel, K: 1, SharedX: true, Y: y, Rows: rows, Cols: cols, XQ: true, Normed: Normed{XG: xb, Parts: xb}})
			},
		} {
			b := d.Batch()
			bad(b)
			if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
				t.Errorf("%dx%d: quantized x where it cannot be: %v; want gpu.ErrShape", rows, cols, err)
			}
		}
	}
	if yqs < 2 {
		t.Fatalf("%d masked cases quantized their output", yqs)
	}
}

// RMSNormXQ writes RMSNorm's output and the same quantized (within a step
// of ref.QuantizeX of that output, as QuantizeX): rows of one group a
// thread, of several, and of a part of the workgroup only.
func TestRMSNormXQ(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ rows, dim int }{{1, 4096}, {2, 256}, {3, 7168}, {1, 48}} {
		xs := randF32(r, c.rows*c.dim, 2)
		ws := randF32(r, c.dim, 1)
		xb, wb := uploadF32(t, d, xs), uploadF32(t, d, ws)
		y := poisoned(t, d, c.rows*c.dim*4)
		q := poisoned(t, d, int(uint64(c.rows)*XQBytes(c.dim)))
		s := NormShape{Rows: c.rows, Dim: c.dim, Eps: 1e-5}
		run(t, d, func(b *gpu.Batch) error { return k.RMSNormXQ(ctxT(t), b, xb, wb, y, q, s) })
		got := readF32(t, d, y, c.rows*c.dim)
		want := ref.RMSNorm(ref.F32(xs), ref.F32(ws), c.rows, c.dim, 1e-5)
		mag := make([]float64, len(want))
		for i := range mag {
			mag[i] = math.Abs(want[i])
		}
		if err := ref.Compare(got, want, mag, ref.Tolerance(ref.OpRMSNorm)); err != nil {
			t.Fatalf("%dx%d: %v", c.rows, c.dim, err)
		}
		withinStep(t, fmt.Sprintf("%dx%d: y", c.rows, c.dim), got, readXQ(t, d, q, c.rows*c.dim), ref.QuantizeX(ref.F32(got)))
	}
	b := d.Batch()
	x := poisoned(t, d, 40*4)
	k.RMSNormXQ(ctxT(t), b, x, x, x, x, NormShape{Rows: 1, Dim: 40})
	if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
		t.Errorf("a row of 40 values: %v; want gpu.ErrShape", err)
	}
}

// AttentionXQ writes Attention's output, the same bytes, and that output
// quantized (within a step of ref.QuantizeX of it): head dims of one,
// two and a part of the merge's 32-dimension workgroups.
func TestAttentionXQ(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, s := range []AttnShape{{Heads: 4, KVHeads: 2, HeadDim: 64, KVLen: 70}, {Heads: 3, KVHeads: 1, HeadDim: 48, KVLen: 9}, {Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 300}} {
		s.Scale = float32(1 / math.Sqrt(float64(s.HeadDim)))
		n := s.Heads * s.HeadDim
		q := uploadF32(t, d, randF32(r, n, 1))
		kc := uploadF32(t, d, randF32(r, s.KVLen*s.KVHeads*s.HeadDim, 1))
		vc := uploadF32(t, d, randF32(r, s.KVLen*s.KVHeads*s.HeadDim, 1))
		plain, out := poisoned(t, d, n*4), poisoned(t, d, n*4)
		oq := poisoned(t, d, int(XQBytes(n)))
		run(t, d, func(b *gpu.Batch) error {
			if err := k.Attention(ctxT(t), b, q, kc, vc, plain, s); err != nil {
				return err
			}
			return k.AttentionXQ(ctxT(t), b, q, kc, vc, out, oq, s)
		})
		want, got := readF32(t, d, plain, n), readF32(t, d, out, n)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%+v: out[%d] = %g; Attention wrote %g", s, i, got[i], want[i])
			}
		}
		withinStep(t, fmt.Sprintf("%+v: out", s), got, readXQ(t, d, oq, n), ref.QuantizeX(ref.F32(got)))
	}
	b := d.Batch()
	x := poisoned(t, d, 4096)
	k.AttentionXQ(ctxT(t), b, x, x, x, x, x, AttnShape{Heads: 2, KVHeads: 1, HeadDim: 40, KVLen: 1, Scale: 1})
	if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
		t.Errorf("head dim 40: %v; want gpu.ErrShape", err)
	}
}

// AccumulateRMSNormXQ is Accumulate and then RMSNormXQ of the new x, in
// one dispatch: x, y and q as the two dispatches write them (within
// float32 rounding, a multiply-add fused or not; q within a step).
func TestAccumulateRMSNormXQ(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ experts, dim, woff int }{{2, 4096, 3}, {1, 256, 0}, {4, 7168, 1}, {3, 1024, 2}, {8, 48, 5}} {
		// A row and a weight more than the shape's, which the dispatches
		// must not read.
		src := uploadF32(t, d, randF32(r, (c.experts+1)*c.dim, 1))
		wts := uploadF32(t, d, randF32(r, c.woff+c.experts+1, 1))
		x0 := randF32(r, c.dim, 1)
		g := uploadF32(t, d, randF32(r, c.dim, 1))
		a := AccumShape{Experts: c.experts, Dim: c.dim, WeightOff: c.woff}
		s := NormShape{Rows: 1, Dim: c.dim, Eps: 1e-5}
		// Two dispatches, then one.
		xa, xb := uploadF32(t, d, x0), uploadF32(t, d, x0)
		ya, yb := poisoned(t, d, c.dim*4), poisoned(t, d, c.dim*4)
		qa, qb := poisoned(t, d, int(XQBytes(c.dim))), poisoned(t, d, int(XQBytes(c.dim)))
		run(t, d, func(b *gpu.Batch) error {
			if err := k.Accumulate(ctxT(t), b, src, wts, xa, a); err != nil {
				return err
			}
			if err := k.RMSNormXQ(ctxT(t), b, xa, g, ya, qa, s); err != nil {
				return err
			}
			return k.AccumulateRMSNormXQ(ctxT(t), b, src, wts, xb, g, yb, qb, a, 1e-5)
		})
		for _, v := range []struct {
			what   string
			want   gpu.Region
			got    gpu.Region
			n      int
			relTol float64
		}{{"x", xa, xb, c.dim, 1e-6}, {"y", ya, yb, c.dim, 1e-5}} {
			want, got := readF32(t, d, v.want, v.n), readF32(t, d, v.got, v.n)
			for i := range want {
				if diff := math.Abs(float64(got[i] - want[i])); diff > v.relTol*(math.Abs(float64(want[i]))+1e-3) {
					t.Fatalf("%+v: %s[%d] = %g; the two dispatches wrote %g", c, v.what, i, got[i], want[i])
				}
			}
		}
		withinStep(t, fmt.Sprintf("%+v: y, one dispatch against two", c), readF32(t, d, yb, c.dim), readXQ(t, d, qb, c.dim), readXQ(t, d, qa, c.dim))
		// AccumulateRMSNormXQTo: the same bits, the new x in xo (x is
		// bound read-only).
		xc, xo := uploadF32(t, d, x0), poisoned(t, d, c.dim*4)
		yc, qc := poisoned(t, d, c.dim*4), poisoned(t, d, int(XQBytes(c.dim)))
		run(t, d, func(b *gpu.Batch) error {
			return k.AccumulateRMSNormXQTo(ctxT(t), b, src, wts, xc, g, yc, qc, xo, a, 1e-5)
		})
		for _, v := range []struct {
			what      string
			want, got gpu.Region
			n         int
		}{{"x out", xb, xo, c.dim * 4}, {"y", yb, yc, c.dim * 4}, {"q", qb, qc, int(XQBytes(c.dim))}} {
			if want, got := readU32(t, d, v.want, v.n/4), readU32(t, d, v.got, v.n/4); !slices.Equal(want, got) {
				t.Fatalf("%+v: AccumulateRMSNormXQTo's %s differs from AccumulateRMSNormXQ's", c, v.what)
			}
		}
	}
	b := d.Batch()
	x := poisoned(t, d, 4096)
	k.AccumulateRMSNormXQ(ctxT(t), b, x, x, x, x, x, x, AccumShape{Experts: 17, Dim: 256}, 1e-5)
	if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
		t.Errorf("17 experts: %v; want gpu.ErrShape", err)
	}
}
