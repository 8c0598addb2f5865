package ops

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/rdrr/peer/gpu"
)

// TestQ4KFFN: the fused gate, up and down products give the bits of the
// two masked dispatches they replace (the quantized activations and the
// down outputs), twice in one batch (the first sets its counters back
// for the second), with the tables' entries in any order and slots
// anywhere in the arena. A choice the tables lack leaves its rows as
// they were, and the dispatch still ends. Both layouts of the gate and
// up products: one block slot (short rows) and two (16 blocks and more;
// one expert there, within lavapipe's 128 MiB a binding). On a GPU also
// Mixtral's shape with all 8 experts chosen, the waiting form three times
// (a race would show by chance, as the poisoned activations' NaNs).
func TestQ4KFFN(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	cpu := d.Info().Type == "cpu"
	for _, c := range []struct {
		hidden, width, nexp, kSel int
		gpuOnly                   bool
	}{{1024, 2048, 8, 2, false}, {4096, 12288, 1, 2, false}, {4096, 14336, 8, 8, true}} {
		t.Run(fmt.Sprintf("%dx%d/%d", c.hidden, c.width, c.nexp), func(t *testing.T) {
			if c.gpuOnly && cpu {
				t.Skip("a GPU's shape: past lavapipe's 128 MiB a binding")
			}
			kSel := c.kSel
			if !CanFFN(c.hidden, c.width, kSel) {
				t.Fatalf("CanFFN(%d, %d, %d) = false", c.hidden, c.width, kSel)
			}
			n := c.nexp
			ab, _, _ := q4kArena(t, d, r, 3*n+1, c.width, c.hidden)
			perm := r.Perm(3*n + 1)
			gate, up, down := perm[:n], perm[n:2*n], perm[2*n:3*n]
			experts := make([]int, n)
			for e := range experts {
				experts[e] = 3*e + 1 // ids the lookup must find, not entry numbers
			}
			xs := randF32(r, c.hidden, 1)
			xb := uploadF32(t, d, xs)
			xq := poisoned(t, d, int(XQBytes(c.hidden)))
			run(t, d, func(b *gpu.Batch) error { return k.QuantizeX(ctxT(t), b, xb, xq, c.hidden) })
			nq := kSel * int(XQBytes(c.width))
			ny := kSel * c.hidden

			// Distinct experts, the last entry's first, then one of them
			// replaced by an expert the tables lack.
			choices := [][]uint32{{uint32(experts[0]), 999}, {999, uint32(experts[0])}}
			if n > 1 {
				all := []uint32{uint32(experts[n-1])}
				for e := 0; len(all) < kSel; e++ {
					all = append(all, uint32(experts[e]))
				}
				lack := slices.Clone(all)
				lack[1] = 999
				choices = [][]uint32{all, lack}
			}
			for _, choice := range choices {
				sel := upload(t, d, gpu.Bytes(choice))
				// The two dispatches.
				act := poisoned(t, d, kSel*c.width*4)
				q1, y1 := poisoned(t, d, nq), poisoned(t, d, ny*4)
				run(t, d, func(b *gpu.Batch) error {
					if err := k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: gate, UpSlots: up, Experts: experts, Sel: sel, K: kSel,
						X: xq, SharedX: true, Y: act, Rows: c.width, Cols: c.hidden, XQ: true, YQ: q1}); err != nil {
						return err
					}
					return k.Q4KMatVecMasked(ctxT(t), b, Masked{Arena: ab, Slots: down, Experts: experts, Sel: sel, K: kSel,
						X: q1, Y: y1, Rows: c.hidden, Cols: c.width, XQ: true})
				})
				// Fused, twice in one batch: in one dispatch (a GPU: its
				// down workgroups wait for the gate and up tiles) and in
				// two (FFN.Apart, all that lavapipe can run).
				for _, apart := range []bool{false, false, false, true} {
					if !apart && cpu {
						continue
					}
					q2, y2 := poisoned(t, d, nq), poisoned(t, d, ny*4)
					ctr := upload(t, d, make([]byte, FFNCounterBytes)) // zeros: Alloc's pooled buffers are not
					f := FFN{Arena: ab, Gate: gate, Up: up, Down: down, Experts: experts, Sel: sel, K: kSel, X: xq, Q: q2, Y: y2, Counters: ctr,
						Hidden: c.hidden, Width: c.width, Apart: apart}
					run(t, d, func(b *gpu.Batch) error {
						if err := k.Q4KFFN(ctxT(t), b, f); err != nil {
							return err
						}
						return k.Q4KFFN(ctxT(t), b, f)
					})
					if got := readU32(t, d, ctr, 4); got[0] != 0 || got[1] != 0 || got[2] != 0 || got[3] != 0 {
						t.Fatalf("apart %v: counters %v after the dispatches; want them set back to zero, and no give-up flag", apart, got)
					}
					gq, wq := readU32(t, d, q2, nq/4), readU32(t, d, q1, nq/4)
					for i := range wq {
						if gq[i] != wq[i] {
							t.Fatalf("apart %v, choice %v: quantized activation word %d = %#x; the masked gate and up products give %#x", apart, choice, i, gq[i], wq[i])
						}
					}
					gy, wy := readF32(t, d, y2, ny), readF32(t, d, y1, ny)
					for i := range wy {
						if math.Float32bits(gy[i]) != math.Float32bits(wy[i]) {
							t.Fatalf("apart %v, choice %v: y[%d] = %v; the masked down products give %v", apart, choice, i, gy[i], wy[i])
						}
					}
					for j, id := range choice {
						rows := gy[j*c.hidden : (j+1)*c.hidden]
						if nan := nanCount(rows); id == 999 && nan != c.hidden || id != 999 && nan != 0 {
							t.Fatalf("apart %v, choice %v: %d of the %d down rows of expert %d not written", apart, choice, nan, c.hidden, id)
						}
					}
					ctr.Release()
				}
			}
		})
	}
	// Shapes refused before anything runs: each a change of one good
	// call (which runs, so that what refuses the others is the shape rule,
	// not their buffers).
	ab, _, _ := q4kArena(t, d, r, 3, 2048, 1024)
	good := FFN{Arena: ab, Gate: []int{0}, Up: []int{1}, Down: []int{2}, Experts: []int{5}, K: 2, Hidden: 1024, Width: 2048, Apart: cpu,
		X: poisoned(t, d, int(XQBytes(1024))), Q: poisoned(t, d, 2*int(XQBytes(2048))), Y: poisoned(t, d, 2*1024*4),
		Sel: upload(t, d, gpu.Bytes([]uint32{5, 999})), Counters: upload(t, d, make([]byte, FFNCounterBytes))}
	run(t, d, func(b *gpu.Batch) error { return k.Q4KFFN(ctxT(t), b, good) })
	for _, change := range []func(f *FFN){
		func(f *FFN) {
			f.Gate, f.Up, f.Down, f.Experts = make([]int, 9), make([]int, 9), make([]int, 9), []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
		},
		func(f *FFN) { f.Down = nil },
		func(f *FFN) { f.K = 0 },
		func(f *FFN) { f.Hidden = 1000 },
		func(f *FFN) { f.Hidden, f.Width = 1<<23, 1<<23 },
		func(f *FFN) { f.Up = []int{-1} },
		func(f *FFN) { f.Experts = []int{-3} },
		func(f *FFN) { f.Gate, f.Up, f.Down, f.Experts = []int{0, 0}, []int{1, 1}, []int{2, 2}, []int{5, 5} },
	} {
		bad := good
		change(&bad)
		b := d.Batch()
		k.Q4KFFN(ctxT(t), b, bad)
		if err := b.Submit(ctxT(t)); !errors.Is(err, gpu.ErrShape) {
			t.Errorf("FFN %d experts %v, K %d, hidden %d, width %d: %v; want gpu.ErrShape", len(bad.Experts), bad.Experts, bad.K, bad.Hidden, bad.Width, err)
		}
	}
}
