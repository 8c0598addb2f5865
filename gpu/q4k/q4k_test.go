package q4k

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestPackScaleMinKnown(t *testing.T) {
	got := PackScaleMin(knownSc, knownM)
	if got != knownPacked {
		t.Fatalf("PackScaleMin = % x; want % x", got, knownPacked)
	}
	for j := 0; j < 8; j++ {
		sc, m := ScaleMin(j, knownPacked[:])
		if sc != knownSc[j] || m != knownM[j] {
			t.Errorf("ScaleMin(%d) = %d, %d; want %d, %d", j, sc, m, knownSc[j], knownM[j])
		}
	}
}

func TestDequantizeKnownBlocks(t *testing.T) {
	blocks, want := KnownBlocks()
	got := make([]float32, len(want))
	if err := Dequantize(got, blocks); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("weight %d (block %d): got %v; want %v", i, i/256, got[i], want[i])
		}
	}
	// Spot values worked out by hand from the first block:
	// weight 0: sub-block 0, q = 3: 0.5*1*3 - 0.25*0 = 1.5
	// weight 40: sub-block 1, q = (40*7+3)%16 = 11: 0.5*2*11 - 0.25*1 = 10.75
	// weight 200: sub-block 6, q = (200*7+3)%16 = 11: 0.5*5*11 - 0.25*63 = 11.75
	for _, c := range []struct {
		i    int
		want float32
	}{{0, 1.5}, {40, 10.75}, {200, 11.75}} {
		if got[c.i] != c.want {
			t.Errorf("weight %d = %v; want %v", c.i, got[c.i], c.want)
		}
	}
}

func TestPackUnpack(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for it := 0; it < 100; it++ {
		var b Block
		b.D, b.Dmin = uint16(r.Uint32()), uint16(r.Uint32())
		for j := range 8 {
			b.Scales[j], b.Mins[j] = uint8(r.IntN(64)), uint8(r.IntN(64))
		}
		for i := range b.Q {
			b.Q[i] = uint8(r.IntN(16))
		}
		buf := make([]byte, BlockBytes)
		b.Pack(buf)
		if got := Unpack(buf); got != b {
			t.Fatalf("Unpack(Pack(b)) != b")
		}
		buf2 := make([]byte, BlockBytes)
		u := Unpack(buf)
		u.Pack(buf2)
		if !bytes.Equal(buf, buf2) {
			t.Fatalf("Pack(Unpack(buf)) != buf")
		}
	}
}

func TestNearestInt(t *testing.T) {
	for _, c := range []struct {
		f    float32
		want int
	}{{0, 0}, {0.5, 0}, {1.5, 2}, {2.5, 2}, {-0.5, 0}, {-1.5, -2}, {3.49, 3}, {14.6, 15}, {-7.7, -8}} {
		if got := nearestInt(c.f); got != c.want {
			t.Errorf("nearestInt(%v) = %d; want %d", c.f, got, c.want)
		}
	}
}

// TestQuantizeRoundTrip checks the quantizer's output decodes close to its
// input: each weight within one quantization step of its sub-block, plus
// the 6-bit scale and f16 rounding.
func TestQuantizeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 64 * BlockWeights
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
		if i%1000 == 7 {
			x[i] *= 8 // outliers
		}
	}
	q := make([]byte, n/BlockWeights*BlockBytes)
	if err := Quantize(q, x); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, n)
	if err := Dequantize(y, q); err != nil {
		t.Fatal(err)
	}
	var se, ss float64
	for b := 0; b < n/BlockWeights; b++ {
		blk := Unpack(q[b*BlockBytes:])
		d, dmin := float64(F16(blk.D)), float64(F16(blk.Dmin))
		for j := 0; j < 8; j++ {
			step := d * float64(blk.Scales[j])
			lo := -dmin * float64(blk.Mins[j])
			for l := 0; l < 32; l++ {
				i := b*BlockWeights + 32*j + l
				e := math.Abs(float64(y[i] - x[i]))
				// Inside the representable range the error is at most half a
				// step (plus rounding); outside it, clamping decides.
				hi := lo + 15*step
				if float64(x[i]) >= lo && float64(x[i]) <= hi && e > 0.5*step+1e-6 {
					t.Fatalf("weight %d: x %v decodes to %v (step %v)", i, x[i], y[i], step)
				}
				se += e * e
				ss += float64(x[i]) * float64(x[i])
			}
		}
	}
	if rel := math.Sqrt(se / ss); rel > 0.12 {
		t.Fatalf("relative RMS error %.3f; want <= 0.12 (Q4_K is ~0.08 on Gaussian data)", rel)
	}
}

func TestQuantizeSpecialBlocks(t *testing.T) {
	zero := make([]float32, BlockWeights)
	q := make([]byte, BlockBytes)
	if err := Quantize(q, zero); err != nil {
		t.Fatal(err)
	}
	y := make([]float32, BlockWeights)
	Dequantize(y, q)
	for i, v := range y {
		if v != 0 {
			t.Fatalf("zero block: weight %d = %v", i, v)
		}
	}
	// A block of small non-negative integers 0..15 with d = 1 must round-trip
	// exactly: make_qkx2_quants finds scale 1, min 0.
	x := make([]float32, BlockWeights)
	for i := range x {
		x[i] = float32(i % 16)
	}
	Quantize(q, x)
	Dequantize(y, q)
	for i := range x {
		if math.Abs(float64(y[i]-x[i])) > 0.02 {
			t.Fatalf("ramp: weight %d = %v; want %v", i, y[i], x[i])
		}
	}
}

func TestSizes(t *testing.T) {
	if err := Dequantize(make([]float32, 256), make([]byte, 143)); err == nil {
		t.Fatal("Dequantize accepted a partial block")
	}
	if err := Quantize(make([]byte, 144), make([]float32, 255)); err == nil {
		t.Fatal("Quantize accepted a partial block")
	}
	if RowBytes(4096) != 16*144 {
		t.Fatal("RowBytes")
	}
}

// BenchmarkQuantize reports Quantize's throughput as a ratio of
// Dequantize's on the same blocks in the same run (the decoder is the
// limit an encoder is compared with).
func BenchmarkQuantize(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, 64*BlockWeights)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 0.02)
	}
	q := make([]byte, RowBytes(len(x)))
	y := make([]float32, len(x))
	b.SetBytes(int64(4 * len(x)))
	var enc, dec time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		Quantize(q, x)
		enc += time.Since(t0)
		t0 = time.Now()
		Dequantize(y, q)
		dec += time.Since(t0)
	}
	b.ReportMetric(float64(len(x)*b.N)/enc.Seconds()/1e6, "Mweights/s")
	b.ReportMetric(dec.Seconds()/enc.Seconds(), "x-dequantize")
}
