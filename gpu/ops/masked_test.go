package ops

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ref"
)

// TestQ4KMatVecMasked checks the products that run with the router's
// choice on the GPU: only the chosen experts run, each into the place of
// its id in sel, from its own x; experts split over two arena buffers fill
// one y from two calls; an unchosen product writes nothing.
func TestQ4KMatVecMasked(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const rows, cols, nslots = 37, 512, 5
	per := rows * cols / 256
	arenas := [][]byte{randQ4K(r, nslots*per), randQ4K(r, nslots*per)}
	bufs := []*gpu.Buffer{upload(t, d, arenas[0]), upload(t, d, arenas[1])}
	// Eight experts: 0-3 in buffer 0 (slots 4,2,0,1), 4-7 in buffer 1
	// (slots 3,0,4,2).
	where := [8]struct{ buf, slot int }{{0, 4}, {0, 2}, {0, 0}, {0, 1}, {1, 3}, {1, 0}, {1, 4}, {1, 2}}
	matrix := func(e int) []float64 {
		w := where[e]
		w64, err := ref.Q4K(arenas[w.buf][w.slot*per*144 : (w.slot+1)*per*144])
		if err != nil {
			t.Fatal(err)
		}
		return w64
	}
	for _, c := range []struct {
		sel     []uint32
		sharedX bool
	}{
		{[]uint32{5, 2}, false},
		{[]uint32{2, 5}, true},
		{[]uint32{7, 6, 0, 3}, false},
		{[]uint32{1}, true},
	} {
		kSel := len(c.sel)
		nx := kSel
		if c.sharedX {
			nx = 1
		}
		x := randF32(r, nx*cols, 1)
		var want, mag []float64
		for j, e := range c.sel {
			xe := x[:cols]
			if !c.sharedX {
				xe = x[j*cols : (j+1)*cols]
			}
			got, m := ref.MatMul(matrix(int(e)), ref.F32(xe), rows, cols, 1)
			want, mag = append(want, got...), append(mag, m...)
		}
		xb := uploadF32(t, d, x)
		sel := upload(t, d, gpu.Bytes(c.sel))
		y := poisoned(t, d, kSel*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			for bi := range bufs {
				var slots, experts []int
				for e, w := range where {
					if w.buf == bi {
						slots, experts = append(slots, w.slot), append(experts, e)
					}
				}
				if err := k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[bi], Slots: slots, Experts: experts, Sel: sel, K: kSel, X: xb, SharedX: c.sharedX, Y: y, Rows: rows, Cols: cols}); err != nil {
					return err
				}
			}
			return nil
		})
		if err := ref.Compare(readF32(t, d, y, kSel*rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatalf("sel %v shared %v: %v", c.sel, c.sharedX, err)
		}
	}
	// A chosen expert that no product covers leaves its rows as they were:
	// the products of unchosen experts write nothing.
	sel := upload(t, d, gpu.Bytes([]uint32{6, 1}))
	x := uploadF32(t, d, randF32(r, cols, 1))
	y := poisoned(t, d, 2*rows*4)
	run(t, d, func(b *gpu.Batch) error {
		return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[0], Slots: []int{4, 2, 0, 1}, Experts: []int{0, 1, 2, 3}, Sel: sel, K: 2, X: x, SharedX: true, Y: y, Rows: rows, Cols: cols})
	})
	got := readF32(t, d, y, 2*rows)
	for i, v := range got[:rows] {
		if !math.IsNaN(float64(v)) && v != got[0] {
			t.Fatalf("row %d of an uncovered expert's output was written: %v", i, v)
		}
	}
	want, mag := ref.MatMul(matrix(1), ref.F32(readF32(t, d, x, cols)), rows, cols, 1)
	if err := ref.Compare(got[rows:], want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
		t.Fatal(err)
	}
	// Gate and up of the same experts in one dispatch: the up products
	// (MaskedUpper) fill the upper half of y.
	{
		sel := upload(t, d, gpu.Bytes([]uint32{3, 0}))
		xs := randF32(r, cols, 1)
		x := uploadF32(t, d, xs)
		const upper = 2*rows*4 + 12 // any multiple of 4
		y := poisoned(t, d, upper+2*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			// gpu.Buffer 0 holds experts 0-3's gates (slots 4,2,0,1) and, for
			// this test, their up matrices (slots 3,0,4,2).
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[0], Slots: []int{4, 2, 0, 1, 3, 0, 4, 2},
				Experts: []int{0, 1, 2, 3, 0 | MaskedUpper, 1 | MaskedUpper, 2 | MaskedUpper, 3 | MaskedUpper}, Sel: sel, K: 2, X: x, SharedX: true, Y: y, YUpper: upper, Rows: rows, Cols: cols})
		})
		upMatrix := func(e int) []float64 { // buffer 0 again, slots 3,0,4,2
			s := []int{3, 0, 4, 2}[e]
			w64, err := ref.Q4K(arenas[0][s*per*144 : (s+1)*per*144])
			if err != nil {
				t.Fatal(err)
			}
			return w64
		}
		var want, mag []float64
		for _, w := range [][]float64{matrix(3), matrix(0)} {
			g, m := ref.MatMul(w, ref.F32(xs), rows, cols, 1)
			want, mag = append(want, g...), append(mag, m...)
		}
		all := readF32(t, d, y, (upper+2*rows*4)/4)
		if err := ref.Compare(all[:2*rows], want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatalf("gate half: %v", err)
		}
		want, mag = nil, nil
		for _, w := range [][]float64{upMatrix(3), upMatrix(0)} {
			g, m := ref.MatMul(w, ref.F32(xs), rows, cols, 1)
			want, mag = append(want, g...), append(mag, m...)
		}
		if err := ref.Compare(all[upper/4:], want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatalf("upper half: %v", err)
		}
	}
	// Bad shapes are refused.
	for _, bad := range []func(b *gpu.Batch) error{
		func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[0], Slots: []int{0, 1}, Experts: []int{0}, Sel: sel, K: 2, X: x, SharedX: true, Y: y, Rows: rows, Cols: cols})
		},
		func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[0], Slots: []int{0}, Experts: []int{0}, Sel: sel, K: 0, X: x, SharedX: true, Y: y, Rows: rows, Cols: cols})
		},
		func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[0], Slots: []int{0}, Experts: []int{0}, Sel: sel, K: 3, X: x, SharedX: true, Y: y, Rows: rows, Cols: cols})
		},
		func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: bufs[0], Slots: []int{0}, Experts: []int{-1}, Sel: sel, K: 2, X: x, SharedX: true, Y: y, Rows: rows, Cols: cols})
		},
	} {
		b := d.Batch()
		bad(b)
		if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
			t.Errorf("bad call: %v; want gpu.ErrShape", err)
		}
	}
}

func TestFlavored(t *testing.T) {
	src := "a\n//+M b\n  //-M c\n//+N d\ne"
	if got := flavored(src, "M"); got != "a\nb\ne" {
		t.Errorf("flavor M: %q", got)
	}
	if got := flavored(src, ""); got != "a\nc\ne" {
		t.Errorf("no flavor: %q", got)
	}
	// Stacked markers: every one must hold.
	src = "a\n//+M //-N b\n//+M //+N c\n//-M //-N d\ne"
	for f, want := range map[string]string{"M": "a\nb\ne", "M N": "a\nc\ne", "N": "a\ne", "": "a\nd\ne"} {
		if got := flavored(src, f); got != want {
			t.Errorf("flavor %q: %q; want %q", f, got, want)
		}
	}
}

func TestKVStore(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const n, rows = 24, 5
	src := randF32(r, 3*n, 1)
	sb := uploadF32(t, d, src)
	kc, vc := poisoned(t, d, rows*n*4), poisoned(t, d, rows*n*4)
	run(t, d, func(b *gpu.Batch) error {
		if err := k.KVStore(ctxT(t), b, sb, kc, vc, KVShape{Dim: n, KOff: n, VOff: 2 * n, Pos: 3}); err != nil {
			return err
		}
		return k.KVStore(ctxT(t), b, sb, kc, vc, KVShape{Dim: n, KOff: 0, VOff: n, Pos: 0})
	})
	gk, gv := readF32(t, d, kc, rows*n), readF32(t, d, vc, rows*n)
	for i := 0; i < n; i++ {
		if gk[3*n+i] != src[n+i] || gv[3*n+i] != src[2*n+i] || gk[i] != src[i] || gv[i] != src[n+i] {
			t.Fatalf("element %d: k %v %v, v %v %v", i, gk[i], gk[3*n+i], gv[i], gv[3*n+i])
		}
		if !math.IsNaN(float64(gk[n+i])) || !math.IsNaN(float64(gv[4*n+i])) {
			t.Fatalf("a row that was not stored changed: %v %v", gk[n+i], gv[4*n+i])
		}
	}
	b := d.Batch()
	k.KVStore(ctxT(t), b, sb, kc, vc, KVShape{Dim: n, KOff: 0, VOff: n, Pos: rows}) // past the cache
	if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
		t.Fatalf("a row past the cache: %v; want gpu.ErrShape", err)
	}
}

// Q4KMatVecAdd adds the product to y; the masked SwiGLU form computes the
// down products from the gate and up halves.
func TestQ4KFusedForms(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const rows, cols = 37, 512
	wq := randQ4K(r, rows*cols/256)
	w64, err := ref.Q4K(wq)
	if err != nil {
		t.Fatal(err)
	}
	xs := randF32(r, cols, 1)
	y0 := randF32(r, rows, 1)
	wb, xb, yb := upload(t, d, wq), uploadF32(t, d, xs), uploadF32(t, d, y0)
	run(t, d, func(b *gpu.Batch) error { return k.Q4KMatVecAdd(ctxT(t), b, wb, xb, yb, rows, cols) })
	prod, mag := ref.MatMul(w64, ref.F32(xs), rows, cols, 1)
	for i := range prod {
		prod[i] += float64(y0[i])
		mag[i] += math.Abs(float64(y0[i]))
	}
	if err := ref.Compare(readF32(t, d, yb, rows), prod, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
		t.Fatalf("y += W x: %v", err)
	}

	// Down products of two chosen experts (of 3 in the arena) from gate
	// and up halves: x_j = silu(gate_j) * up_j.
	arena := randQ4K(r, 3*rows*cols/256)
	ab := upload(t, d, arena)
	gate, up := randF32(r, 2*cols, 1), randF32(r, 2*cols, 1)
	const upOff = 2*cols*4 + 256
	gu := make([]float32, upOff/4+2*cols)
	copy(gu, gate)
	copy(gu[upOff/4:], up)
	gub := uploadF32(t, d, gu)
	sel := upload(t, d, gpu.Bytes([]uint32{2, 0}))
	y := poisoned(t, d, 2*rows*4)
	run(t, d, func(b *gpu.Batch) error {
		return k.Q4KMatVecMaskedSwiGLU(ctxT(t), b, Masked{Arena: ab, Slots: []int{1, 2, 0}, Experts: []int{0, 1, 2}, Sel: sel, K: 2, X: gub, Y: y, Rows: rows, Cols: cols}, upOff)
	})
	var want, wmag []float64
	for j, e := range []int{2, 0} {
		slot := []int{1, 2, 0}[e]
		we, err := ref.Q4K(arena[slot*rows*cols/256*144 : (slot+1)*rows*cols/256*144])
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float64, cols)
		for i := range x {
			g := float64(gate[j*cols+i])
			x[i] = g / (1 + math.Exp(-g)) * float64(up[j*cols+i])
		}
		p, m := ref.MatMul(we, x, rows, cols, 1)
		want, wmag = append(want, p...), append(wmag, m...)
	}
	if err := ref.Compare(readF32(t, d, y, 2*rows), want, wmag, ref.Tolerance(ref.OpMatMul)); err != nil {
		t.Fatalf("masked SwiGLU down: %v", err)
	}
}

// TestQ4KMatVecMaskedGLU checks an expert's gate and up products in one
// dispatch (Masked.UpSlots, and Group.UpSlots): each chosen expert's
// place in y holds silu(gate x) * up x, unchosen experts write nothing,
// and what the GLU form cannot take is refused. A small shape (two rows a thread) and a
// Mixtral-like one (four, pipelined).
func TestQ4KMatVecMaskedGLU(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	// Two, four and eight rows a thread (the last for 2048-column rows).
	for _, c := range []struct{ rows, cols int }{{37, 512}, {300, 4096}, {300, 2048}} {
		rows, cols := c.rows, c.cols
		ab, _, matrix := q4kArena(t, d, r, 7, rows, cols)
		// Experts 0-2: gates at slots 5, 1, 3; ups at 0, 6, 2.
		gates, ups := []int{5, 1, 3}, []int{0, 6, 2}
		xs := randF32(r, cols, 1)
		xb := uploadF32(t, d, xs)
		sel := upload(t, d, gpu.Bytes([]uint32{2, 0}))
		y := poisoned(t, d, 2*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: gates, UpSlots: ups, Experts: []int{0, 1, 2}, Sel: sel, K: 2, X: xb, SharedX: true, Y: y, Rows: rows, Cols: cols})
		})
		var want, mag []float64
		for _, e := range []int{2, 0} {
			g, gm := ref.MatMul(matrix(gates[e]), ref.F32(xs), rows, cols, 1)
			u, um := ref.MatMul(matrix(ups[e]), ref.F32(xs), rows, cols, 1)
			w, m := gluRef(g, gm, u, um)
			want, mag = append(want, w...), append(mag, m...)
		}
		if err := ref.Compare(readF32(t, d, y, 2*rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatalf("%dx%d: %v", rows, cols, err)
		}
		// The same as a plain group (no choice on the GPU): experts 2 and 0
		// in that order, into y.
		y2 := poisoned(t, d, 2*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{gates[2], gates[0]}, UpSlots: []int{ups[2], ups[0]}, X: xb, SharedX: true, Y: y2, Rows: rows, Cols: cols})
		})
		if err := ref.Compare(readF32(t, d, y2, 2*rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatalf("%dx%d, plain group: %v", rows, cols, err)
		}
		// A variant of q4k_matmul (its own source, as a kernel written
		// before the GLU flavors would be) does not stand in for
		// q4k_matmul_glu.
		if c.rows == 37 {
			of, err := Builtin("q4k_matmul", nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.UseVariant(ctxT(t), gpu.Variant{Of: of, Source: of.Source}); err != nil {
				t.Fatal(err)
			}
			y3 := poisoned(t, d, 2*rows*4)
			run(t, d, func(b *gpu.Batch) error {
				return k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{gates[2], gates[0]}, UpSlots: []int{ups[2], ups[0]}, X: xb, SharedX: true, Y: y3, Rows: rows, Cols: cols})
			})
			d.UseOriginal("q4k_matmul")
			if err := ref.Compare(readF32(t, d, y3, 2*rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
				t.Fatalf("%dx%d, plain group beside a q4k_matmul variant: %v", rows, cols, err)
			}
		}
		// Bad shapes are refused: more than MaxGroup/2 experts, gate and up
		// slots of different counts, an upper-half expert, odd rows a
		// thread.
		nine := make([]int, MaxGroup/2+1)
		for _, bad := range []Masked{
			{Arena: ab, Slots: nine, UpSlots: nine, Experts: nine, Sel: sel, K: 2, X: xb, SharedX: true, Y: y, Rows: rows, Cols: cols},
			{Arena: ab, Slots: gates, UpSlots: ups[:2], Experts: []int{0, 1, 2}, Sel: sel, K: 2, X: xb, SharedX: true, Y: y, Rows: rows, Cols: cols},
			{Arena: ab, Slots: gates, UpSlots: ups, Experts: []int{0, 1, 2 | MaskedUpper}, Sel: sel, K: 2, X: xb, SharedX: true, Y: y, Rows: rows, Cols: cols},
		} {
			b := d.Batch()
			k.Q4KMatVecMasked(ctxT(t), b, bad)
			if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
				t.Errorf("bad GLU call %d experts, %d up slots: %v; want gpu.ErrShape", len(bad.Experts), len(bad.UpSlots), err)
			}
		}
		b := d.Batch()
		k.Q4KMatVecGroupWith(ctxT(t), b, Q4KConfig{WG: 128, SPR: 1, Rows: 3}, Group{Arena: ab, Slots: gates, UpSlots: ups, X: xb, SharedX: true, Y: y, Rows: rows, Cols: cols})
		if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
			t.Errorf("GLU group of 3 rows a thread: %v; want gpu.ErrShape", err)
		}
	}
}

// RopeKV is Rope and then KVStore in one dispatch: the same x, k cache
// and v cache, bit for bit (the pairs are rotated by the same code), with
// rows other than the position's untouched; NeoX and GPT-J, whole and
// partial rotation, a stacked q, k and v row as the decode step has it.
func TestRopeKV(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ nq, nkv, hd, rot, pos int }{
		{4, 2, 8, 8, 3}, {32, 8, 128, 128, 4095}, {3, 1, 10, 6, 9}, {2, 2, 64, 32, 0},
	} {
		for _, style := range []abi.RopeStyle{abi.RopeNeoX, abi.RopeGPTJ} {
			t.Run(fmt.Sprintf("%+v/%v", c, style), func(t *testing.T) {
				n := (c.nq + 2*c.nkv) * c.hd
				kvn := c.nkv * c.hd
				rows := c.pos + 2
				x := randF32(r, n, 1)
				freqs := uploadF32(t, d, RopeFreqs(10000, c.rot))
				rs := RopeShape{Tokens: 1, Heads: c.nq + c.nkv, HeadDim: c.hd, RotDim: c.rot, Pos0: c.pos, Style: style}
				kv := KVShape{Dim: kvn, KOff: c.nq * c.hd, VOff: (c.nq + c.nkv) * c.hd, Pos: c.pos}
				var got, want [3][]float32
				for i, fused := range []bool{true, false} {
					xb := uploadF32(t, d, x)
					kc, vc := poisoned(t, d, rows*kvn*4), poisoned(t, d, rows*kvn*4)
					run(t, d, func(b *gpu.Batch) error {
						if fused {
							return k.RopeKV(ctxT(t), b, xb, freqs, kc, vc, rs, kv)
						}
						if err := k.Rope(ctxT(t), b, xb.Sub(0, uint64(kv.VOff*4)), freqs, rs); err != nil {
							return err
						}
						return k.KVStore(ctxT(t), b, xb, kc, vc, kv)
					})
					out := &got
					if i == 1 {
						out = &want
					}
					*out = [3][]float32{readF32(t, d, xb, n), readF32(t, d, kc, rows*kvn), readF32(t, d, vc, rows*kvn)}
				}
				for j, name := range []string{"x", "k cache", "v cache"} {
					for i := range want[j] {
						g, w := got[j][i], want[j][i]
						if g != w && !(math.IsNaN(float64(g)) && math.IsNaN(float64(w))) {
							t.Fatalf("%s[%d] = %v; Rope and KVStore give %v", name, i, g, w)
						}
					}
				}
			})
		}
	}
	// A shape whose k heads are not x's last heads is refused.
	if _, err := RopeKVLaunch(RopeShape{Tokens: 1, Heads: 6, HeadDim: 8, RotDim: 8}, KVShape{Dim: 16, KOff: 8, VOff: 48}); !errors.Is(err, gpu.ErrShape) {
		t.Fatalf("k heads in the middle: %v; want gpu.ErrShape", err)
	}
}

// AccumulateNorm hands an RMSNorm to the products that read its output
// (Normed): dst += the weighted sources as Accumulate, x * g, and one
// partial sum of x^2 per 256 elements; with no source (k = 0) and a
// length that is not a multiple of 256.
func TestAccumulateNorm(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct{ experts, dim int }{{2, 4096}, {1, 1000}, {0, 4096}, {3, 256}} {
		t.Run(fmt.Sprintf("k%d/d%d", c.experts, c.dim), func(t *testing.T) {
			src, w := randF32(r, c.experts*c.dim, 1), randF32(r, c.experts+1, 1)
			dst, g := randF32(r, c.dim, 5), randF32(r, c.dim, 1)
			db, xg, parts := uploadF32(t, d, dst), poisoned(t, d, c.dim*4), poisoned(t, d, AccumParts(c.dim)*4)
			srcb := uploadF32(t, d, append(src, 0)) // a binding is never empty
			run(t, d, func(b *gpu.Batch) error {
				return k.AccumulateNorm(ctxT(t), b, srcb, uploadF32(t, d, w), db, uploadF32(t, d, g),
					Normed{XG: xg, Parts: parts}, AccumShape{Experts: c.experts, Dim: c.dim, WeightOff: 1})
			})
			x := ref.Accumulate(ref.F32(dst), ref.F32(src), ref.F32(w[1:]), c.experts, c.dim)
			// Scales: the sum of the magnitudes that met in each value.
			xmag := make([]float64, c.dim)
			want, mag := make([]float64, c.dim), make([]float64, c.dim)
			sums := make([]float64, AccumParts(c.dim))
			for i, v := range x {
				xmag[i] = math.Abs(float64(dst[i]))
				for j := 0; j < c.experts; j++ {
					xmag[i] += math.Abs(float64(w[1+j] * src[j*c.dim+i]))
				}
				want[i], mag[i] = v*float64(g[i]), xmag[i]*math.Abs(float64(g[i]))
				sums[i/256] += v * v
			}
			if err := ref.Compare(readF32(t, d, db, c.dim), x, xmag, ref.Tolerance(ref.OpAccum)); err != nil {
				t.Fatalf("dst: %v", err)
			}
			if err := ref.Compare(readF32(t, d, xg, c.dim), want, mag, ref.Tolerance(ref.OpAccum)); err != nil {
				t.Fatalf("x * g: %v", err)
			}
			if err := ref.Compare(readF32(t, d, parts, len(sums)), sums, sums, ref.Tolerance(ref.OpRMSNorm)); err != nil {
				t.Fatalf("partial sums: %v", err)
			}
		})
	}
}

// The PART products read an RMSNorm's output from AccumulateNorm (x * g
// and its partial sums, no norm dispatch): W RMSNorm(x, g) as the float64
// norm and product give it, Q4_K for the configurations a decode step
// picks and awkward ones (pipelined or not, shifts, every workgroup
// size), masked (two of three experts, gate and up halves in one
// dispatch) and dense f32 (a router). x far from unit scale (large, or
// small enough that eps counts), so that a missing or wrong scale cannot
// pass.
func TestNormedProducts(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const eps = 1e-5
	// normed runs AccumulateNorm (no source) on x with weight g and
	// returns what it hands over, and the float64 norm of x.
	normed := func(t *testing.T, x, g []float32) (Normed, []float64) {
		n := Normed{XG: poisoned(t, d, len(x)*4), Parts: poisoned(t, d, AccumParts(len(x))*4), Eps: eps}
		run(t, d, func(b *gpu.Batch) error {
			return k.AccumulateNorm(ctxT(t), b, uploadF32(t, d, []float32{0}), uploadF32(t, d, []float32{0}), uploadF32(t, d, x), uploadF32(t, d, g), n, AccumShape{Dim: len(x)})
		})
		return n, ref.RMSNorm(ref.F32(x), ref.F32(g), 1, len(x), eps)
	}
	for _, c := range []struct {
		rows, cols int
		cfg        Q4KConfig
	}{
		{6144, 4096, DefaultQ4KConfig(6144, 4096, 1)},
		{37, 4608, DefaultQ4KConfig(6144, 4096, 1)},
		{37, 4608, DefaultQ4KConfig(2*14336, 4096, 1)},
		{37, 2048, DefaultQ4KConfig(7168, 2048, 1)},
		{3, 512, Q4KConfig{SPR: 2, Rows: 2}},
		{11, 2560, Q4KConfig{SPR: 32, Rows: 1, Shifts: true}},
		{11, 2560, Q4KConfig{WG: 64, SPR: 8, Rows: 4, Pipeline: true}},
		{1, 256, Q4KConfig{SPR: 1, Rows: 16, WG: 64}},
	} {
		t.Run(fmt.Sprintf("%dx%d%+v", c.rows, c.cols, c.cfg), func(t *testing.T) {
			blocks := randQ4K(r, c.rows*c.cols/256)
			w64, err := ref.Q4K(blocks)
			if err != nil {
				t.Fatal(err)
			}
			n, xn := normed(t, randF32(r, c.cols, 20), randF32(r, c.cols, 1))
			want, mag := ref.MatMul(w64, xn, c.rows, c.cols, 1)
			y := poisoned(t, d, c.rows*4)
			run(t, d, func(b *gpu.Batch) error {
				l, err := Q4KPartLaunch(c.cfg, c.rows, c.cols, n)
				return k.launch(ctxT(t), b, l, err, upload(t, d, blocks), n.XG, y, n.Parts)
			})
			if err := ref.Compare(readF32(t, d, y, c.rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("default", func(t *testing.T) {
		const rows, cols = 300, 1024
		blocks := randQ4K(r, rows*cols/256)
		w64, _ := ref.Q4K(blocks)
		n, xn := normed(t, randF32(r, cols, 0.01), randF32(r, cols, 3))
		want, mag := ref.MatMul(w64, xn, rows, cols, 1)
		y := poisoned(t, d, rows*4)
		run(t, d, func(b *gpu.Batch) error { return k.Q4KMatVecNormed(ctxT(t), b, upload(t, d, blocks), n, y, rows, cols) })
		if err := ref.Compare(readF32(t, d, y, rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("masked", func(t *testing.T) {
		const rows, cols = 300, 2048
		mat := rows * cols / 256 * 144
		arena := randQ4K(r, 6*rows*cols/256)                            // gate and up of experts 0, 1, 2
		n, xn := normed(t, randF32(r, cols, 0.01), randF32(r, cols, 3)) // eps is 1/10 of mean(x^2)
		sel := upload(t, d, gpu.Bytes([]uint32{2, 0}))
		const upper = 2 * rows * 4
		y := poisoned(t, d, 2*upper)
		slots := []int{0, 1, 2, 3, 4, 5}
		experts := []int{0, 1, 2, 0 | MaskedUpper, 1 | MaskedUpper, 2 | MaskedUpper}
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: upload(t, d, arena), Slots: slots, Experts: experts, Sel: sel, K: 2,
				SharedX: true, Y: y, YUpper: upper, Rows: rows, Cols: cols, Normed: n})
		})
		var want, wmag []float64
		for _, half := range []int{0, 3} {
			for _, e := range []int{2, 0} {
				we, err := ref.Q4K(arena[(half+e)*mat : (half+e+1)*mat])
				if err != nil {
					t.Fatal(err)
				}
				p, m := ref.MatMul(we, xn, rows, cols, 1)
				want, wmag = append(want, p...), append(wmag, m...)
			}
		}
		if err := ref.Compare(readF32(t, d, y, 4*rows), want, wmag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dense router", func(t *testing.T) {
		const rows, cols = 8, 4096
		wr := randF32(r, rows*cols, 0.05)
		n, xn := normed(t, randF32(r, cols, 0.01), randF32(r, cols, 3)) // eps is 1/10 of mean(x^2)
		want, mag := ref.MatMul(ref.F32(wr), xn, rows, cols, 1)
		y := poisoned(t, d, rows*4)
		run(t, d, func(b *gpu.Batch) error { return k.MatVecNormed(ctxT(t), b, uploadF32(t, d, wr), n, y, rows, cols) })
		if err := ref.Compare(readF32(t, d, y, rows), want, mag, ref.Tolerance(ref.OpMatMul)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRopeAttention: RoPE, the cache store and attention in the split
// dispatch give the bits of RopeKV and then Attention (the caches and the
// output, float and quantized), on the shapes it fuses; on the others it
// records those two and gives their bits too.
func TestRopeAttention(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	for _, c := range []struct {
		nq, nkv, hd, pos int
		fused            bool
		style            abi.RopeStyle
		rot              int // 0: hd
	}{
		{32, 8, 128, 0, true, abi.RopeNeoX, 0}, {32, 8, 128, 31, true, abi.RopeNeoX, 0}, {32, 8, 128, 32, true, abi.RopeNeoX, 0}, {32, 8, 128, 300, true, abi.RopeNeoX, 0},
		{8, 2, 64, 63, true, abi.RopeNeoX, 0}, {16, 1, 64, 5, true, abi.RopeNeoX, 0}, {128, 8, 128, 70, true, abi.RopeNeoX, 0}, // 16 query heads a cache head: two z groups
		{8, 2, 64, 200, true, abi.RopeNeoX, 0}, // seven chunks at head dim 64
		{4, 2, 32, 40, false, abi.RopeNeoX, 0}, // hd 32: a pair's halves in two threads
		{6, 3, 36, 9, false, abi.RopeNeoX, 0},
		{8, 2, 64, 40, false, abi.RopeGPTJ, 0},   // pairs the kernel does not make
		{8, 2, 128, 40, false, abi.RopeNeoX, 64}, // part of each head rotated
	} {
		rot := c.rot
		if rot == 0 {
			rot = c.hd
		}
		for _, xq := range []bool{false, true} {
			if xq && c.hd%XQGroup != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%+v/xq=%v", c, xq), func(t *testing.T) {
				n := (c.nq + 2*c.nkv) * c.hd
				kvn := c.nkv * c.hd
				rows := c.pos + 2 // a row past the new one stays as it was
				x := randF32(r, n, 1)
				cacheK, cacheV := randF32(r, rows*kvn, 1), randF32(r, rows*kvn, 1)
				freqs := uploadF32(t, d, RopeFreqs(10000, rot))
				as := AttnShape{Heads: c.nq, KVHeads: c.nkv, HeadDim: c.hd, KVLen: c.pos + 1, Scale: float32(1 / math.Sqrt(float64(c.hd)))}
				rs := RopeShape{Tokens: 1, Heads: c.nq + c.nkv, HeadDim: c.hd, RotDim: rot, Pos0: c.pos, Style: c.style}
				kv := KVShape{Dim: kvn, KOff: c.nq * c.hd, VOff: (c.nq + c.nkv) * c.hd, Pos: c.pos}
				if _, _, _, ok, err := RopeAttentionLaunches(as, rs, kv); err != nil || ok != c.fused {
					t.Fatalf("RopeAttentionLaunches: fused %v, %v; want fused %v", ok, err, c.fused)
				}
				if c.fused {
					// The kernel rotates at position KVLen - 1 and stores
					// row Pos: a step whose rotation, row or length differ
					// is not fused.
					rs1, as1 := rs, as
					rs1.Pos0++
					as1.KVLen++
					for _, bad := range []struct {
						as AttnShape
						rs RopeShape
					}{{as, rs1}, {as1, rs}} {
						if _, _, _, ok, err := RopeAttentionLaunches(bad.as, bad.rs, kv); ok {
							t.Fatalf("RopeAttentionLaunches(%+v, %+v, %+v): fused (%v)", bad.as, bad.rs, kv, err)
						}
					}
				}
				nout := c.nq * c.hd
				nq8 := int(XQBytes(nout) / 4)
				var got, want [4][]float32
				for i, fused := range []bool{true, false} {
					xb := uploadF32(t, d, x)
					kc, vc := uploadF32(t, d, cacheK), uploadF32(t, d, cacheV)
					out := poisoned(t, d, nout*4)
					var outq gpu.Region
					if xq {
						outq = poisoned(t, d, nq8*4)
					}
					run(t, d, func(b *gpu.Batch) error {
						if fused {
							return k.RopeAttention(ctxT(t), b, xb, freqs, kc, vc, out, outq, as, rs, kv)
						}
						if err := k.RopeKV(ctxT(t), b, xb, freqs, kc, vc, rs, kv); err != nil {
							return err
						}
						if xq {
							return k.AttentionXQ(ctxT(t), b, xb.Sub(0, uint64(nout*4)), kc, vc, out, outq, as)
						}
						return k.Attention(ctxT(t), b, xb.Sub(0, uint64(nout*4)), kc, vc, out, as)
					})
					o := &got
					if i == 1 {
						o = &want
					}
					*o = [4][]float32{readF32(t, d, kc, rows*kvn), readF32(t, d, vc, rows*kvn), readF32(t, d, out, nout)}
					if xq {
						o[3] = readF32(t, d, outq, nq8)
					}
				}
				for j, name := range []string{"k cache", "v cache", "out", "quantized out"} {
					for i := range want[j] {
						if g, w := math.Float32bits(got[j][i]), math.Float32bits(want[j][i]); g != w {
							t.Fatalf("%s[%d] = %v; RopeKV and Attention give %v", name, i, got[j][i], want[j][i])
						}
					}
				}
			})
		}
	}
}
