// Package q4k encodes and decodes GGML's block_q4_K, bit for bit.
//
// A block holds 256 weights in 144 bytes:
//
//	offset  size  field
//	0       2     d     f16, super-block scale for the 6-bit scales
//	2       2     dmin  f16, super-block scale for the 6-bit mins
//	4       12    scales: 8 scales and 8 mins of 6 bits (get_scale_min_k4)
//	16      128   qs: 4-bit quants; byte 32*g+l holds weight 64*g+l in its
//	              low nibble and weight 64*g+32+l in its high nibble
//
// Weight 32*j+l (sub-block j) decodes as d*sc[j]*q - dmin*m[j], computed in
// float32 exactly as GGML's dequantize_row_q4_K does. Quantize follows
// quantize_row_q4_K_ref (make_qkx2_quants with its parameters). The package
// is pure Go and is the reference for the GPU kernels and the encoder of the
// synthetic model generator.
package q4k

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/x448/float16"
)

const (
	// BlockWeights is QK_K: weights per block.
	BlockWeights = 256
	// BlockBytes is sizeof(block_q4_K).
	BlockBytes = 144
)

// ErrSize: a length is not a whole number of blocks.
var ErrSize = errors.New("q4k: length is not a whole number of blocks")

// RowBytes is the size of a row of n weights (n a multiple of 256).
func RowBytes(n int) int { return n / BlockWeights * BlockBytes }

// Block is one block's fields, unpacked.
type Block struct {
	D, Dmin uint16              // f16 bits
	Scales  [8]uint8            // 6-bit sub-block scales
	Mins    [8]uint8            // 6-bit sub-block mins
	Q       [BlockWeights]uint8 // 4-bit quants, in weight order
}

// ScaleMin is GGML's get_scale_min_k4: the 6-bit scale and min of
// sub-block j from the 12 packed bytes.
func ScaleMin(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	sc = (q[j+4] & 0xF) | ((q[j-4] >> 6) << 4)
	m = (q[j+4] >> 4) | ((q[j-0] >> 6) << 4)
	return sc, m
}

// PackScaleMin is the inverse of ScaleMin: it packs 8 scales and 8 mins
// (each < 64) the way quantize_row_q4_K_ref does.
func PackScaleMin(sc, m [8]uint8) (out [12]byte) {
	for j := 0; j < 8; j++ {
		ls, lm := sc[j]&63, m[j]&63
		if j < 4 {
			out[j] = ls
			out[j+4] = lm
		} else {
			out[j+4] = (ls & 0xF) | ((lm & 0xF) << 4)
			out[j-4] |= (ls >> 4) << 6
			out[j-0] |= (lm >> 4) << 6
		}
	}
	return out
}

// Pack encodes b into dst (BlockBytes long).
func (b *Block) Pack(dst []byte) {
	_ = dst[BlockBytes-1]
	binary.LittleEndian.PutUint16(dst[0:], b.D)
	binary.LittleEndian.PutUint16(dst[2:], b.Dmin)
	s := PackScaleMin(b.Scales, b.Mins)
	copy(dst[4:16], s[:])
	qs := dst[16:BlockBytes]
	for g := 0; g < 4; g++ {
		for l := 0; l < 32; l++ {
			qs[32*g+l] = b.Q[64*g+l]&0xF | (b.Q[64*g+32+l]&0xF)<<4
		}
	}
}

// Unpack decodes a block from src (BlockBytes long).
func Unpack(src []byte) (b Block) {
	_ = src[BlockBytes-1]
	b.D = binary.LittleEndian.Uint16(src[0:])
	b.Dmin = binary.LittleEndian.Uint16(src[2:])
	for j := 0; j < 8; j++ {
		b.Scales[j], b.Mins[j] = ScaleMin(j, src[4:16])
	}
	qs := src[16:BlockBytes]
	for g := 0; g < 4; g++ {
		for l := 0; l < 32; l++ {
			b.Q[64*g+l] = qs[32*g+l] & 0xF
			b.Q[64*g+32+l] = qs[32*g+l] >> 4
		}
	}
	return b
}

// F16 converts f16 bits to float32 (GGML_FP16_TO_FP32, exact).
func F16(h uint16) float32 { return float16.Frombits(h).Float32() }

// ToF16 converts to f16 bits, rounding to nearest even (GGML_FP32_TO_FP16).
func ToF16(f float32) uint16 { return uint16(float16.Fromfloat32(f)) }

// DequantizeBlock decodes one block (dequantize_row_q4_K for 256 weights).
func DequantizeBlock(dst *[BlockWeights]float32, src []byte) {
	_ = src[BlockBytes-1]
	d := F16(binary.LittleEndian.Uint16(src[0:]))
	dmin := F16(binary.LittleEndian.Uint16(src[2:]))
	scales := src[4:16]
	q := src[16:BlockBytes]
	y := dst[:]
	is := 0
	for j := 0; j < BlockWeights; j += 64 {
		sc, m := ScaleMin(is, scales)
		d1, m1 := d*float32(sc), dmin*float32(m)
		sc, m = ScaleMin(is+1, scales)
		d2, m2 := d*float32(sc), dmin*float32(m)
		for l := 0; l < 32; l++ {
			// The explicit float32 conversions forbid fusing into an FMA
			// (Go spec), matching GGML's separately rounded steps.
			y[l] = float32(d1*float32(q[l]&0xF)) - m1
		}
		for l := 0; l < 32; l++ {
			y[32+l] = float32(d2*float32(q[l]>>4)) - m2
		}
		y = y[64:]
		q = q[32:]
		is += 2
	}
}

// Dequantize decodes len(src)/BlockBytes blocks into dst, which must hold
// 256 weights per block.
func Dequantize(dst []float32, src []byte) error {
	if len(src)%BlockBytes != 0 || len(dst) != len(src)/BlockBytes*BlockWeights {
		return fmt.Errorf("%w: %d bytes into %d weights", ErrSize, len(src), len(dst))
	}
	for i := 0; i < len(src)/BlockBytes; i++ {
		DequantizeBlock((*[BlockWeights]float32)(dst[i*BlockWeights:]), src[i*BlockBytes:])
	}
	return nil
}

// Quantize encodes src (a multiple of 256 weights) into dst
// (len(src)/256*144 bytes) with GGML's quantize_row_q4_K_ref.
func Quantize(dst []byte, src []float32) error {
	if len(src)%BlockWeights != 0 || len(dst) != len(src)/BlockWeights*BlockBytes {
		return fmt.Errorf("%w: %d weights into %d bytes", ErrSize, len(src), len(dst))
	}
	for i := 0; i < len(src)/BlockWeights; i++ {
		quantizeBlock(dst[i*BlockBytes:(i+1)*BlockBytes], src[i*BlockWeights:(i+1)*BlockWeights])
	}
	return nil
}

// nearestInt is GGML's nearest_int: round half to even through the float32
// magic-number trick (valid for |f| < 2^22, as in GGML).
func nearestInt(f float32) int {
	val := f + 12582912
	i := int32(math.Float32bits(val))
	return int((i & 0x007fffff) - 0x00400000)
}

func clampInt(v, lo, hi int) int { return max(lo, min(hi, v)) }

func quantizeBlock(y []byte, x []float32) {
	var (
		L       [BlockWeights]uint8
		laux    [32]uint8
		weights [32]float32
		mins    [8]float32
		scales  [8]float32
	)
	var maxScale, maxMin float32
	for j := 0; j < 8; j++ {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for l := 0; l < 32; l++ {
			sumX2 += float32(xs[l] * xs[l])
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l := 0; l < 32; l++ {
			weights[l] = avX + float32(math.Abs(float64(xs[l])))
		}
		scales[j] = makeQKX2Quants(15, (*[32]float32)(xs), &weights, (*[32]uint8)(L[32*j:]), &mins[j], &laux, -1, 0.1, 20)
		if scales[j] > maxScale {
			maxScale = scales[j]
		}
		if mins[j] > maxMin {
			maxMin = mins[j]
		}
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := 0; j < 8; j++ {
		ls[j] = min(63, uint8(nearestInt(invScale*scales[j])))
		lm[j] = min(63, uint8(nearestInt(invMin*mins[j])))
	}
	packed := PackScaleMin(ls, lm)
	dh := ToF16(maxScale / 63)
	mh := ToF16(maxMin / 63)
	binary.LittleEndian.PutUint16(y[0:], dh)
	binary.LittleEndian.PutUint16(y[2:], mh)
	copy(y[4:16], packed[:])
	for j := 0; j < 8; j++ {
		sc, m := ScaleMin(j, packed[:])
		d := F16(dh) * float32(sc)
		if d == 0 {
			continue
		}
		dm := F16(mh) * float32(m)
		for ii := 0; ii < 32; ii++ {
			l := nearestInt((x[32*j+ii] + dm) / d)
			L[32*j+ii] = uint8(clampInt(l, 0, 15))
		}
	}
	q := y[16:BlockBytes]
	for j := 0; j < BlockWeights; j += 64 {
		for l := 0; l < 32; l++ {
			q[l] = L[j+l] | L[j+l+32]<<4
		}
		q = q[32:]
	}
}

// makeQKX2Quants is GGML's make_qkx2_quants with use_mad = false for one
// sub-block of 32 weights, in float32 arithmetic step for step: every sum
// is accumulated in GGML's order and every product rounded on its own
// (the explicit float32 conversions forbid fused multiply-adds), so the
// result is GGML's bit for bit. x[i]-min, which GGML recomputes in every
// step, is computed only when min changes: the same operands give the
// same float.
func makeQKX2Quants(nmax int, x, weights *[32]float32, L *[32]uint8, theMin *float32, laux *[32]uint8, rmin, rdelta float32, nstep int) float32 {
	minV, maxV := x[0], x[0]
	sumW := weights[0]
	sumX := sumW * x[0]
	for i := 1; i < 32; i++ {
		if x[i] < minV {
			minV = x[i]
		}
		if x[i] > maxV {
			maxV = x[i]
		}
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if minV > 0 {
		minV = 0
	}
	if maxV == minV {
		*L = [32]uint8{}
		*theMin = -minV
		return 0
	}
	var xm [32]float32
	for i := range xm {
		xm[i] = x[i] - minV
	}
	fmax := float32(nmax)
	iscale := fmax / (maxV - minV)
	scale := 1 / iscale
	var bestMad float32
	for i := 0; i < 32; i++ {
		l := uint8(clampInt(nearestInt(iscale*xm[i]), 0, nmax))
		L[i] = l
		diff := float32(scale*float32(l)) + minV - x[i]
		bestMad += float32(weights[i] * float32(diff*diff))
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + fmax) / (maxV - minV)
		var sumL, sumL2, sumXL float32
		for i := 0; i < 32; i++ {
			l := uint8(clampInt(nearestInt(iscale*xm[i]), 0, nmax))
			laux[i] = l
			fl := float32(l)
			wl := float32(weights[i] * fl)
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var mad float32
			for i := 0; i < 32; i++ {
				diff := float32(thisScale*float32(laux[i])) + thisMin - x[i]
				mad += float32(weights[i] * float32(diff*diff))
			}
			if mad < bestMad {
				*L = *laux
				bestMad = mad
				scale = thisScale
				minV = thisMin
				// GGML's later steps use the new min (x[i]-min and max-min).
				for i := range xm {
					xm[i] = x[i] - minV
				}
			}
		}
	}
	*theMin = -minV
	return scale
}
