package q4k

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"
)

// FuzzPackUnpack: every 144-byte string is a block, and Unpack/Pack
// round-trips it exactly (all 12 scale bytes' bits are used).
func FuzzPackUnpack(f *testing.F) {
	blocks, _ := KnownBlocks()
	f.Add(blocks[:BlockBytes])
	f.Add(make([]byte, BlockBytes))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < BlockBytes {
			return
		}
		b = b[:BlockBytes]
		u := Unpack(b)
		out := make([]byte, BlockBytes)
		u.Pack(out)
		if !bytes.Equal(out, b) {
			t.Fatalf("Pack(Unpack(b)) = % x; want % x", out, b)
		}
		var y [BlockWeights]float32
		DequantizeBlock(&y, b)
	})
}

// FuzzQuantize: any input of weight-like magnitude quantizes without
// panicking and decodes to no NaN. (Beyond ~1e6 the f16 super-block scale
// overflows to Inf, in GGML too.)
func FuzzQuantize(f *testing.F) {
	f.Add(make([]byte, 4*BlockWeights))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) < 4*BlockWeights {
			return
		}
		x := make([]float32, BlockWeights)
		for i := range x {
			v := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 1e5 {
				v = 0
			}
			x[i] = v
		}
		q := make([]byte, BlockBytes)
		if err := Quantize(q, x); err != nil {
			t.Fatal(err)
		}
		y := make([]float32, BlockWeights)
		if err := Dequantize(y, q); err != nil {
			t.Fatal(err)
		}
		for i, v := range y {
			if math.IsNaN(float64(v)) {
				t.Fatalf("weight %d decodes to NaN", i)
			}
		}
	})
}
