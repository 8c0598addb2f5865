package experts

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
)

// TestGPUModelHeadXQ: with every product of quantized x, the LM head
// reads the final norm quantized (xqHead): a step's logits are the head's
// weights times that norm's quantized copy as the GPU wrote it (xnq,
// decoded), and with RDRR_GPU_XQHEAD=0 times the norm itself (xn). The
// copy is within half a step of ref.QuantizeX of xn, and the two
// expectations lie far more apart than the tolerance, so the test tells
// which one the head computed.
func TestGPUModelHeadXQ(t *testing.T) {
	for _, v := range []string{"RDRR_GPU_XQ", "RDRR_GPU_NORM", "RDRR_GPU_GLU", "RDRR_GPU_FUSE", "RDRR_GPU_XQHEAD"} {
		if os.Getenv(v) != "" {
			t.Skipf("%s is set: the test sets the head's activations itself", v)
		}
	}
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
			// The quantized copy, decoded (quantize.inc's form: a group of
			// 16 as 12 words, word k of the first four v(4k+2) + 65536
			// v(4k), of the next four v(4k+3) + 65536 v(4k+1), then the
			// scale), and checked against ref.QuantizeX of xn.
			qraw := make([]byte, ops.XQBytes(c.HiddenSize))
			if err := d.Read(ctx, g.gateX(), qraw); err != nil {
				t.Fatal(err)
			}
			xq := make([]float64, c.HiddenSize)
			for grp := 0; grp < c.HiddenSize/16; grp++ {
				word := func(i int) uint32 { return binary.LittleEndian.Uint32(qraw[4*(12*grp+i):]) }
				scale := float64(math.Float32frombits(word(8)))
				for k := range 4 {
					a, b := int32(word(k)), int32(word(4+k))
					lo, hi := int32(int16(a)), int32(int16(b))
					v := [4]int32{(a - lo) >> 16, (b - hi) >> 16, lo, hi}
					for i, q := range v {
						xq[16*grp+4*k+i] = float64(q) * scale
					}
				}
			}
			mirror := ref.QuantizeX(xn)
			for i := range xq {
				step := 0.0
				for _, u := range xn[i/16*16 : i/16*16+16] {
					step = max(step, math.Abs(u)/127)
				}
				if d := math.Abs(xq[i] - mirror[i]); d > step*(1+1e-6) {
					t.Fatalf("xnq[%d] = %g; ref.QuantizeX of xn gives %g (a step %g)", i, xq[i], mirror[i], step)
				}
			}
			w := refModel(t, m, src).w("lm_head.weight")
			want := map[bool][]float64{
				true:  matvec(w, xq, c.VocabSize, c.HiddenSize),
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
