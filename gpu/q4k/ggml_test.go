package q4k

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"strings"
	"testing"
)

// The files under testdata/ggml were written by GGML's own functions
// (testdata/ggml/README.md says which commit and how).

func readGGML(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/ggml/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readF32(t *testing.T, name string) []float32 {
	b := readGGML(t, name)
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// sameFloat: the same bits, or both NaN (GGML's NaN payloads are not part
// of the format).
func sameFloat(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// Quantize makes GGML's quantize_row_q4_K_ref bytes, and Dequantize
// GGML's dequantize_row_q4_K floats, bit for bit, on every case.
func TestBitExactWithGGML(t *testing.T) {
	names := strings.Fields(string(readGGML(t, "q4k-cases.txt")))
	x := readF32(t, "q4k-inputs.f32")
	want := readGGML(t, "q4k-ggml.bin")
	wantDeq := readF32(t, "q4k-ggml-dequant.f32")
	if len(names) < 30 || len(x) != len(names)*BlockWeights || len(want) != len(names)*BlockBytes || len(wantDeq) != len(x) {
		t.Fatalf("testdata: %d cases, %d weights, %d bytes, %d dequantized", len(names), len(x), len(want), len(wantDeq))
	}
	got := make([]byte, len(want))
	if err := Quantize(got, x); err != nil { // all rows in one call: blocks are independent
		t.Fatal(err)
	}
	for i, name := range names {
		g, w := got[i*BlockBytes:(i+1)*BlockBytes], want[i*BlockBytes:(i+1)*BlockBytes]
		if !bytes.Equal(g, w) {
			t.Errorf("case %d (%s): Quantize differs from GGML's quantize_row_q4_K_ref\ngot  %x\nwant %x", i, name, g, w)
		}
	}
	deq := make([]float32, len(x))
	if err := Dequantize(deq, want); err != nil {
		t.Fatal(err)
	}
	for i := range deq {
		if !sameFloat(deq[i], wantDeq[i]) {
			t.Fatalf("case %s, weight %d: Dequantize %g; GGML %g", names[i/BlockWeights], i%BlockWeights, deq[i], wantDeq[i])
		}
	}
}

// Dequantize agrees with GGML on arbitrary blocks, whose scales may be
// subnormal, huge, infinite or NaN.
func TestDequantizeArbitraryBlocksLikeGGML(t *testing.T) {
	blocks := readGGML(t, "q4k-random-blocks.bin")
	want := readF32(t, "q4k-random-dequant.f32")
	if len(blocks) == 0 || len(want) != len(blocks)/BlockBytes*BlockWeights {
		t.Fatalf("testdata: %d bytes, %d weights", len(blocks), len(want))
	}
	got := make([]float32, len(want))
	if err := Dequantize(got, blocks); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if !sameFloat(got[i], want[i]) {
			t.Fatalf("block %d weight %d: Dequantize %g (%#x); GGML %g (%#x)", i/BlockWeights, i%BlockWeights,
				got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// ToF16 rounds as GGML_FP32_TO_FP16 does at the values where rounding
// decides (midpoints, one ulp either side, subnormals, overflow).
func TestToF16LikeGGML(t *testing.T) {
	in := readF32(t, "f16-inputs.f32")
	want := readGGML(t, "f16-ggml.bin")
	if len(in) == 0 || len(want) != 2*len(in) {
		t.Fatalf("testdata: %d inputs, %d output bytes", len(in), len(want))
	}
	for i, f := range in {
		w := binary.LittleEndian.Uint16(want[2*i:])
		if g := ToF16(f); g != w {
			t.Errorf("ToF16(%g) = %#04x; GGML %#04x", f, g, w)
		}
	}
}
