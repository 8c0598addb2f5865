package experts

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/rdrr/peer/gpu/ref"
	"github.com/rdrr/peer/tiers"
)

// TestGPUModelHeadXQ: with every product of quantized x, the LM head
// reads the final norm quantized (xqHead): a step's logits are the head's
// weights times ref.QuantizeX of that norm as the GPU wrote it (xn), and
// with RDRR_GPU_XQHEAD=0 times the norm itself. The two expectations lie
// far more apart than the tolerance, so the test tells which one the head
// computed.
func TestGPUModelHeadXQ(t *testing.T) {
	for _, quantized := range []bool{true, false} {
		t.Run(fmt.Sprintf("xqhead=%v", quantized), func(t *testing.T) {
			if !quantized {
				t.Setenv("RDRR_GPU_XQHEAD", "0")
			}
			d := openTestDevice(t, 0)
			m, src := presetInStore(t, "tiny-moe", 1)
			g, _ := testGPUModel(t, d, m, src, 3*len(m.Experts))
			if !g.xqAttn {
				t.Fatal("the default model does not quantize every product's x")
			}
			if g.quantizedHead() != quantized {
				t.Fatalf("quantizedHead %v; want %v", g.quantizedHead(), quantized)
			}
			ctx := context.Background()
			var logits []float32
			for _, tok := range []int{'H', 'i', '!'} {
				var err error
				if logits, err = g.Step(ctx, tok); err != nil {
					t.Fatal(err)
				}
			}
			c := &m.Config
			raw := make([]byte, c.HiddenSize*4)
			if err := d.Read(ctx, g.buf["xn"].Sub(0, uint64(len(raw))), raw); err != nil {
				t.Fatal(err)
			}
			xn := make([]float64, c.HiddenSize)
			for i := range xn {
				xn[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
			}
			rcache, err := tiers.New(tiers.Config{RAM: m.TotalSize, Disk: src})
			if err != nil {
				t.Fatal(err)
			}
			defer rcache.Close()
			rm, err := NewRefModel(ctx, m, rcache)
			if err != nil {
				t.Fatal(err)
			}
			w := rm.w("lm_head.weight")
			want := map[bool][]float64{
				true:  matvec(w, ref.QuantizeX(xn), c.VocabSize, c.HiddenSize),
				false: matvec(w, xn, c.VocabSize, c.HiddenSize),
			}
			scale := 0.0
			for _, v := range want[false] {
				scale = max(scale, math.Abs(v))
			}
			off := func(a []float32, b []float64) float64 {
				worst := 0.0
				for i := range b {
					worst = max(worst, math.Abs(float64(a[i])-b[i])/scale)
				}
				return worst
			}
			const tol = 2e-5
			if got := off(logits, want[quantized]); !(got <= tol) {
				t.Fatalf("logits %.2e of the largest from the head of the norm (quantized %v); tolerance %.0e", got, quantized, tol)
			}
			apart := 0.0
			for i := range want[true] {
				apart = max(apart, math.Abs(want[true][i]-want[false][i])/scale)
			}
			if apart < 20*tol {
				t.Fatalf("the quantized and float norms' heads lie %.2e apart: the test cannot tell them apart", apart)
			}
			t.Logf("%.2e from the head computed, %.2e between the two", off(logits, want[quantized]), apart)
		})
	}
}
