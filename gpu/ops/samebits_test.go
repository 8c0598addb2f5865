package ops

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/rdrr/peer/gpu"
)

// An expert's product has the same bits however it is dispatched: alone,
// in a group of the layer's K, masked among all of a layer's experts or
// among the few that were resident, gate and up together (GLU) or apart
// with a SwiGLU after them. A paged layer runs whichever of these its
// cache state allows, and the router's choice downstream turns a last-bit
// difference into another expert (and, through quantized x, a one-step
// difference into another token): the same prompt must not generate
// other tokens because other experts happened to be in VRAM.
//
// Both shapes' layouts depend on the count of products a dispatch is
// configured for (4096 x 4096: block slots 8 for one product, 4 for two;
// 12288 x 4096: 2 and 1, and for quantized x 2 slots either way but,
// before gate and up apart took GLU's layout, 1 for them apart), so a
// dispatch configured for its own count sums one product's rows in
// another order than a dispatch of K = 2.
func TestProductsSameBits(t *testing.T) {
	for _, rows := range []int{4096, 12288} {
		t.Run(fmt.Sprint(rows), func(t *testing.T) { testSameBits(t, rows, 4096) })
	}
}

func testSameBits(t *testing.T, rows, cols int) {
	d, k := shared.d, shared.k
	r := rng(t)
	const K = 2
	if a, b := groupConfig(rows, cols, false), groupConfig(K*rows, cols, false); a.SPR == b.SPR {
		t.Fatalf("the shape does not test anything: %+v for one product, %+v for %d", a, b, K)
	}
	// Slots 0 and 1: the gate matrices of experts 0 and 1; 2 and 3 their up.
	ab, _, _ := q4kArena(t, d, r, 4, rows, cols)
	xs := randF32(r, cols, 1)
	xb := uploadF32(t, d, xs)
	qb := poisoned(t, d, int(XQBytes(cols)))
	run(t, d, func(b *gpu.Batch) error { return k.QuantizeX(ctxT(t), b, xb, qb, cols) })
	sel := upload(t, d, gpu.Bytes([]uint32{1, 0})) // the router chose expert 1, then 0
	read := func(y gpu.Region, n int) []byte {
		t.Helper()
		out := make([]byte, n)
		if err := d.Read(ctxT(t), y, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	vec := uint64(rows * 4)
	for _, xq := range []bool{false, true} {
		x := gpu.Region(xb)
		if xq {
			x = qb
		}
		name := fmt.Sprintf("xq %v", xq)
		// The reference: expert 0's and 1's gate products in one group of K.
		y := poisoned(t, d, K*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{0, 1}, X: x, SharedX: true, Y: y, Rows: rows, Cols: cols, XQ: xq, K: K})
		})
		want := read(y, K*rows*4)
		same := func(what string, got []byte, want []byte) {
			t.Helper()
			if !bytes.Equal(got, want) {
				n := 0
				for i := 0; i+4 <= len(got); i += 4 {
					if !bytes.Equal(got[i:i+4], want[i:i+4]) {
						n++
					}
				}
				t.Errorf("%s, %s: %d of %d outputs differ in their bits from the group of %d", name, what, n, len(got)/4, K)
			}
		}
		// Each alone, configured for K.
		for e := range K {
			y1 := poisoned(t, d, rows*4)
			run(t, d, func(b *gpu.Batch) error {
				return k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{e}, X: x, SharedX: true, Y: y1, Rows: rows, Cols: cols, XQ: xq, K: K})
			})
			same(fmt.Sprintf("expert %d alone", e), read(y1, rows*4), want[uint64(e)*vec:uint64(e+1)*vec])
		}
		// Masked: among all four matrices as experts 0..3, and among the one
		// of expert 1 that was resident (the router's first choice).
		ym := poisoned(t, d, K*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: []int{0, 1, 2, 3}, Experts: []int{0, 1, 2, 3}, Sel: sel, K: K, X: x, SharedX: true, Y: ym, Rows: rows, Cols: cols, XQ: xq})
		})
		got := read(ym, K*rows*4)
		same("masked, all resident (first choice)", got[:vec], want[vec:2*vec])
		same("masked, all resident (second choice)", got[vec:], want[:vec])
		y1 := poisoned(t, d, K*rows*4)
		run(t, d, func(b *gpu.Batch) error {
			return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: []int{1}, Experts: []int{1}, Sel: sel, K: K, X: x, SharedX: true, Y: y1, Rows: rows, Cols: cols, XQ: xq})
		})
		same("masked, one resident", read(y1, rows*4), want[vec:2*vec])
		// Gate and up together against apart: expert 0 (gate 0, up 2).
		yg, yu, ys, yglu := poisoned(t, d, rows*4), poisoned(t, d, rows*4), poisoned(t, d, rows*4), poisoned(t, d, rows*4)
		run(t, d, func(b *gpu.Batch) error {
			if err := k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{0}, X: x, SharedX: true, Y: yg, Rows: rows, Cols: cols, XQ: xq, K: K}); err != nil {
				return err
			}
			if err := k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{2}, X: x, SharedX: true, Y: yu, Rows: rows, Cols: cols, XQ: xq, K: K}); err != nil {
				return err
			}
			if err := k.SwiGLU(ctxT(t), b, yg, yu, ys, rows); err != nil {
				return err
			}
			return k.Q4KMatVecGroup(ctxT(t), b, Group{Arena: ab, Slots: []int{0}, UpSlots: []int{2}, X: x, SharedX: true, Y: yglu, Rows: rows, Cols: cols, XQ: xq, K: K})
		})
		same("GLU against gate, up and SwiGLU apart", read(yglu, rows*4), read(ys, rows*4))
	}
}
