package ref

import (
	"errors"
	"math"
	"testing"

	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/q4k"
)

// Hand-worked cases: the references are the ground truth of the kernels,
// so they are checked against arithmetic done by hand, not against
// themselves.

func near(t *testing.T, what string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d values; want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Abs(got[i]-want[i]) > 1e-12*math.Max(1, math.Abs(want[i])) {
			t.Fatalf("%s[%d] = %v; want %v", what, i, got[i], want[i])
		}
	}
}

func TestMatMul(t *testing.T) {
	// W = [[1 2 3] [4 5 6]], x = [1 0 -1], [2 1 0]
	y, mag := MatMul([]float64{1, 2, 3, 4, 5, 6}, []float64{1, 0, -1, 2, 1, 0}, 2, 3, 2)
	near(t, "y", y, []float64{-2, -2, 4, 13})
	near(t, "mag", mag, []float64{4, 10, 4, 13})
}

// Q4KMatMul is MatMul of the widened blocks, bit for bit (the same sums
// in the same order), with the known blocks (their weights checked against
// GGML's in gpu/q4k) as 4 rows of 256 and as 2 rows of 512.
func TestQ4KMatMul(t *testing.T) {
	blocks, w32 := q4k.KnownBlocks()
	w := F32(w32)
	for _, c := range []struct{ rows, cols, n int }{{4, 256, 1}, {4, 256, 3}, {2, 512, 2}, {1, 1024, 1}} {
		x := make([]float64, c.n*c.cols)
		for i := range x {
			x[i] = math.Sin(float64(i)) * 3
		}
		y, mag, err := Q4KMatMul(blocks, x, c.rows, c.cols, c.n)
		if err != nil {
			t.Fatal(err)
		}
		wantY, wantMag := MatMul(w, x, c.rows, c.cols, c.n)
		for i := range wantY {
			if y[i] != wantY[i] || mag[i] != wantMag[i] {
				t.Fatalf("%+v: element %d: %v, %v; want %v, %v", c, i, y[i], mag[i], wantY[i], wantMag[i])
			}
		}
	}
	for _, c := range []struct{ rows, cols int }{{5, 256}, {1, 100}, {2, 0}} {
		if _, _, err := Q4KMatMul(blocks, make([]float64, 1024), c.rows, c.cols, 1); err == nil {
			t.Errorf("%+v of 4 blocks: no error", c)
		}
	}
}

func TestRMSNorm(t *testing.T) {
	// mean(3², 4²) = 12.5
	y := RMSNorm([]float64{3, 4}, []float64{1, 2}, 1, 2, 0)
	s := 1 / math.Sqrt(12.5)
	near(t, "y", y, []float64{3 * s, 8 * s})
}

func TestSoftmax(t *testing.T) {
	near(t, "y", Softmax([]float64{0, math.Log(3), 5, 5}, 2, 2), []float64{0.25, 0.75, 0.5, 0.5})
}

func TestRope(t *testing.T) {
	// rot 2, freq 1: element pair turns by pos radians.
	x := []float64{1, 2, 7}
	near(t, "pos0", Rope(x, 1, 1, 3, 2, 0, []float64{1}, abi.RopeNeoX), x)
	got := Rope(x, 1, 1, 3, 2, 0, []float64{math.Pi / 2}, abi.RopeGPTJ)
	got = Rope(got, 1, 1, 3, 2, 1, []float64{math.Pi / 2}, abi.RopeGPTJ) // pos 1: +90 degrees
	near(t, "quarter turn", got, []float64{-2, 1, 7})
	// NeoX pairs i with i+rot/2; GPT-J pairs 2i with 2i+1.
	x4 := []float64{1, 2, 3, 4}
	f := []float64{math.Pi, math.Pi} // half turns negate both pairs
	near(t, "neox", Rope(x4, 1, 1, 4, 4, 1, f, abi.RopeNeoX), []float64{-1, -2, -3, -4})
	if fr := RopeFreqs(10000, 4); math.Abs(fr[1]-0.01) > 1e-15 {
		t.Fatalf("RopeFreqs(10000, 4) = %v; want [1 0.01]", fr)
	}
}

func TestAttention(t *testing.T) {
	// One cached position: the output is its value, whatever the scores.
	v := []float64{5, 6}
	near(t, "one", Attention([]float64{1, 1}, []float64{3, -2}, v, 1, 1, 2, 1, 1), v)
	// Two positions with scores 0 and ln 3: weights 1/4, 3/4. Two query
	// heads share the single kv head.
	k := []float64{0, 0, math.Log(3), 0}
	vv := []float64{4, 0, 0, 8}
	got := Attention([]float64{1, 0, 1, 0}, k, vv, 2, 1, 2, 2, 1)
	near(t, "gqa", got, []float64{1, 6, 1, 6})
}

func TestTopK(t *testing.T) {
	ids, w := TopK([]float64{1, 3, 2, 3}, 1, 4, Route{Mode: abi.RouteSoftmaxTopK, K: 2})
	// The tie at 3 goes to the lower index; weights softmax over (3, 3).
	if ids[0] != 1 || ids[1] != 3 {
		t.Fatalf("ids = %v; want [1 3]", ids)
	}
	near(t, "w", w, []float64{0.5, 0.5})

	// Sigmoid, 2 groups of 2, keep 1 group, K 2, scale 2. Logits 0 give
	// s = 0.5; group scores are sums of the two selection scores
	// (s + bias): group 0 = 0.5+0.5, group 1 = (0.5+1) + (0.5-1) = 1.0: tie,
	// lower group wins. Selected: experts 0 and 1, weights 0.5/1 * 2 = 1.
	ids, w = TopK([]float64{0, 0, 0, 0}, 1, 4, Route{Mode: abi.RouteSigmoidTopK, K: 2, Bias: []float64{0, 0, 1, -1}, Groups: 2, TopKGroup: 1, Scale: 2})
	if ids[0] != 0 || ids[1] != 1 {
		t.Fatalf("grouped ids = %v; want [0 1]", ids)
	}
	near(t, "grouped w", w, []float64{1, 1})
	// Without groups the bias decides: expert 2 (1.5), then 0 (0.5).
	ids, w = TopK([]float64{0, 0, 0, 0}, 1, 4, Route{Mode: abi.RouteSigmoidTopK, K: 2, Bias: []float64{0, 0, 1, -1}})
	if ids[0] != 2 || ids[1] != 0 {
		t.Fatalf("biased ids = %v; want [2 0]", ids)
	}
	near(t, "biased w", w, []float64{0.5, 0.5})
}

func TestSmallOps(t *testing.T) {
	near(t, "swiglu", SwiGLU([]float64{0, math.Log(3)}, []float64{5, 4}), []float64{0, math.Log(3) * 0.75 * 4})
	near(t, "accumulate", Accumulate([]float64{1, 1}, []float64{1, 2, 3, 4}, []float64{2, -1}, 2, 2), []float64{0, 1})
	near(t, "embed", Embed([]float64{1, 2, 3, 4, 5, 6}, []int{2, 0}, 2), []float64{5, 6, 1, 2})
	if got := Argmax([]float64{1, math.NaN(), 3, 3, -1}); got != 2 {
		t.Fatalf("Argmax = %d; want 2", got)
	}
}

func TestTopP(t *testing.T) {
	// probabilities 0.5, 0.3, 0.2 (logits are their logs)
	l := []float64{math.Log(0.5), math.Log(0.3), math.Log(0.2)}
	// top-p 0.6 keeps {0.5, 0.3} (mass 0.8); u = 0.7 aims at 0.56 of the
	// mass: past token 0 (0.5), inside token 1.
	if tok, _ := TopP(l, 1, 0.6, 0.7); tok != 1 {
		t.Fatalf("token = %d; want 1", tok)
	}
	// u = 0.5 aims at 0.4: token 0.
	if tok, _ := TopP(l, 1, 0.6, 0.5); tok != 0 {
		t.Fatalf("token = %d; want 0", tok)
	}
	// top-p 0.5 keeps only token 0.
	if tok, _ := TopP(l, 1, 0.5, 0.99); tok != 0 {
		t.Fatalf("token = %d; want 0", tok)
	}
	// top-p 1 keeps all: u = 0.9 lands in token 2 (cumulative 0.8 .. 1).
	if tok, _ := TopP(l, 1, 1, 0.9); tok != 2 {
		t.Fatalf("token = %d; want 2", tok)
	}
	// Probabilities 0.4, 0.2, 0.2, 0.2: top-p 0.7 falls inside the tie,
	// which is kept whole (mass 1): 0.3 from flipping (only top-p <= 0.4
	// or > 1 would not keep it); u = 0.45 aims at 0.45: token 1, 0.05 in.
	l = []float64{math.Log(0.4), math.Log(0.2), math.Log(0.2), math.Log(0.2)}
	if tok, margin := TopP(l, 1, 0.7, 0.45); tok != 1 || math.Abs(margin-0.05) > 1e-9 {
		t.Fatalf("token, margin = %d, %v; want 1, 0.05", tok, margin)
	}
	// u = 0 takes the first kept token, however the sums round.
	if tok, margin := TopP(l, 1, 0.7, 0); tok != 0 || math.Abs(margin-0.3) > 1e-9 {
		t.Fatalf("token, margin = %d, %v; want 0, 0.3 (u = 0: only the nucleus's edge decides)", tok, margin)
	}
	// Top-p 1 keeps every token however the sums round: only u decides.
	if _, margin := TopP(l, 1, 1, 0.3); math.Abs(margin-0.1) > 1e-9 {
		t.Fatalf("margin = %v; want 0.1 (top-p 1 keeps all; the target is 0.1 from token 0's end)", margin)
	}
	if _, margin := TopP(l, 1, 0.7, 0.5); math.Abs(margin-0.1) > 1e-9 {
		t.Fatalf("margin = %v; want 0.1 (the tie's edge is 0.3 away, the target 0.1)", margin)
	}
}

func TestCompare(t *testing.T) {
	tol := Tol{Abs: 0, Rel: 1e-3}
	if err := Compare([]float32{1, 2}, []float64{1, 2.001}, nil, tol); err != nil {
		t.Fatal(err)
	}
	if err := Compare([]float32{1, 2}, []float64{1, 2.01}, nil, tol); !errors.Is(err, ErrMismatch) {
		t.Fatalf("err = %v; want ErrMismatch", err)
	}
	if err := Compare([]float32{float32(math.NaN())}, []float64{1}, nil, Tol{Abs: 1e9}); !errors.Is(err, ErrMismatch) {
		t.Fatal("NaN passed")
	}
	// A dot product near zero is judged against its magnitude.
	if err := Compare([]float32{1e-4}, []float64{0}, []float64{1}, tol); err != nil {
		t.Fatal(err)
	}
}
