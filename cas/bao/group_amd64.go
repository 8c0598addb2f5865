package bao

import "lukechampine.com/blake3/guts"

// compressGroup returns the node of one group's data: SIMD (AVX-512 or
// AVX2) through guts on amd64.
func compressGroup(data []byte, counter uint64, scratch *[GroupSize]byte) guts.Node {
	copy(scratch[:], data)
	return guts.CompressBuffer(scratch, len(data), &guts.IV, counter, 0)
}
