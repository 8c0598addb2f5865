package q4k

import "encoding/binary"

// knownScales is a hand-packed scales field. Sub-block scales
// [1 2 3 63 32 17 5 48] and mins [0 1 62 7 33 16 63 2], packed as
// get_scale_min_k4 reads them:
//
//	bytes 0-3:  sc[j] | (sc[j+4]>>4)<<6    = 0x81 0x42 0x03 0xff
//	bytes 4-7:  m[j]  | (m[j+4]>>4)<<6     = 0x80 0x41 0xfe 0x07
//	bytes 8-11: sc[j+4]&15 | (m[j+4]&15)<<4 = 0x10 0x01 0xf5 0x20
var (
	knownSc     = [8]uint8{1, 2, 3, 63, 32, 17, 5, 48}
	knownM      = [8]uint8{0, 1, 62, 7, 33, 16, 63, 2}
	knownPacked = [12]byte{0x81, 0x42, 0x03, 0xff, 0x80, 0x41, 0xfe, 0x07, 0x10, 0x01, 0xf5, 0x20}
)

// KnownBlocks returns hand-built GGML blocks (4 of them) and their exact weights: every
// product d*sc*q and dmin*m is exactly representable, so any correct
// dequantizer (FMA or not) must return these values bit for bit.
func KnownBlocks() (blocks []byte, want []float32) {
	type spec struct {
		d, dmin float32
		q       func(l int) uint8
	}
	specs := []spec{
		{0.5, 0.25, func(l int) uint8 { return uint8((l*7 + 3) % 16) }},
		{1, 0, func(l int) uint8 { return uint8(15 - l%16) }},
		{1.0 / 1024, 1.5, func(l int) uint8 { return uint8(l / 16) }},
		{-2, 0.125, func(l int) uint8 { return uint8((l * 5) % 16) }},
	}
	for _, s := range specs {
		blk := make([]byte, BlockBytes)
		binary.LittleEndian.PutUint16(blk[0:], ToF16(s.d))
		binary.LittleEndian.PutUint16(blk[2:], ToF16(s.dmin))
		copy(blk[4:16], knownPacked[:])
		var q [BlockWeights]uint8
		for l := range q {
			q[l] = s.q(l)
		}
		// qs by hand: byte 32g+l = q[64g+l] | q[64g+32+l]<<4.
		for g := 0; g < 4; g++ {
			for l := 0; l < 32; l++ {
				blk[16+32*g+l] = q[64*g+l] | q[64*g+32+l]<<4
			}
		}
		for i := 0; i < BlockWeights; i++ {
			j := i / 32
			want = append(want, s.d*float32(knownSc[j])*float32(q[i])-s.dmin*float32(knownM[j]))
		}
		blocks = append(blocks, blk...)
	}
	return blocks, want
}
