package q4k

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"testing"
)

func readF32(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// Quantize and Dequantize match GGML's reference bit for bit, on inputs
// and outputs made by GGML itself (testdata/ggml/README.md).
func TestBitExactWithGGML(t *testing.T) {
	x := readF32(t, "testdata/ggml/q4k-inputs.f32")
	want, err := os.ReadFile("testdata/ggml/q4k-ggml.bin")
	if err != nil {
		t.Fatal(err)
	}
	wantDeq := readF32(t, "testdata/ggml/q4k-ggml-dequant.f32")
	names := []string{"gaussian", "zero", "constant", "tiny", "huge", "negative", "outlier", "ramp", "uniform", "mixed-scale"}
	if len(x) != len(names)*BlockWeights || len(want) != len(names)*BlockBytes {
		t.Fatalf("testdata: %d weights, %d bytes", len(x), len(want))
	}
	got := make([]byte, len(want))
	if err := Quantize(got, x); err != nil {
		t.Fatal(err)
	}
	for i, name := range names {
		g, w := got[i*BlockBytes:(i+1)*BlockBytes], want[i*BlockBytes:(i+1)*BlockBytes]
		if !bytes.Equal(g, w) {
			t.Errorf("%s: Quantize differs from GGML's quantize_row_q4_K_ref\ngot  %x\nwant %x", name, g, w)
		}
	}
	deq := make([]float32, len(x))
	if err := Dequantize(deq, want); err != nil {
		t.Fatal(err)
	}
	for i := range deq {
		if math.Float32bits(deq[i]) != math.Float32bits(wantDeq[i]) {
			t.Fatalf("%s weight %d: Dequantize %g; GGML %g", names[i/BlockWeights], i%BlockWeights, deq[i], wantDeq[i])
		}
	}
}
