package bao

import (
	"encoding/binary"
	"math/bits"

	"lukechampine.com/blake3/guts"
)

// compressGroupScalar returns the BLAKE3 node of a group's data (at most
// GroupSize bytes, chunk counters from counter, the IV as key, no flags):
// what guts.CompressBuffer returns for it. It is scalar BLAKE3 that reads
// the data in place and keeps the state in locals; guts' generic code
// (what non-amd64 builds get, WebAssembly among them) copies every block
// and node through memory, and in the browser peer, where every group a
// page fetches is verified on the page's one thread, this one is faster
// (measured in the page: see DESIGN.md, "Browser peer").
// TestCompressGroupScalar checks it against guts on every length.
func compressGroupScalar(data []byte, counter uint64) guts.Node {
	if len(data) <= guts.ChunkSize {
		return chunkNode(data, counter)
	}
	var cvs [GroupSize / guts.ChunkSize][8]uint32
	n := 0
	for ; len(data) > 0; n++ {
		k := min(len(data), guts.ChunkSize)
		last := chunkNode(data[:k], counter+uint64(n))
		cvs[n] = compress(&last.CV, &last.Block, last.Counter, last.BlockLen, last.Flags)
		data = data[k:]
	}
	// Merge as guts does: pairs, level by level, an odd one carried up.
	for n > 2 {
		h := n / 2
		for i := range h {
			var blk [16]uint32
			copy(blk[:8], cvs[2*i][:])
			copy(blk[8:], cvs[2*i+1][:])
			cvs[i] = compress(&guts.IV, &blk, 0, guts.BlockSize, guts.FlagParent)
		}
		if n%2 != 0 {
			cvs[h] = cvs[n-1]
			h++
		}
		n = h
	}
	return guts.ParentNode(cvs[0], cvs[1], &guts.IV, 0)
}

// chunkNode compresses every block of one chunk (at most 1 KiB) but the
// last, and returns the node of the last.
func chunkNode(chunk []byte, counter uint64) guts.Node {
	cv := guts.IV
	flags := uint32(guts.FlagChunkStart)
	var blk [16]uint32
	for len(chunk) > guts.BlockSize {
		for i := range blk {
			blk[i] = binary.LittleEndian.Uint32(chunk[4*i:])
		}
		cv = compress(&cv, &blk, counter, guts.BlockSize, flags)
		flags = 0
		chunk = chunk[guts.BlockSize:]
	}
	var last [guts.BlockSize]byte
	copy(last[:], chunk)
	for i := range blk {
		blk[i] = binary.LittleEndian.Uint32(last[4*i:])
	}
	return guts.Node{CV: cv, Block: blk, Counter: counter, BlockLen: uint32(len(chunk)), Flags: flags | guts.FlagChunkEnd}
}

// compress is BLAKE3's compression function, returning the chaining value
// (the first 8 words of its output).
func compress(cv *[8]uint32, m *[16]uint32, counter uint64, blockLen, flags uint32) [8]uint32 {
	m0, m1, m2, m3, m4, m5, m6, m7 := m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]
	m8, m9, m10, m11, m12, m13, m14, m15 := m[8], m[9], m[10], m[11], m[12], m[13], m[14], m[15]
	s0, s1, s2, s3, s4, s5, s6, s7 := cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7]
	s8, s9, s10, s11 := guts.IV[0], guts.IV[1], guts.IV[2], guts.IV[3]
	s12, s13, s14, s15 := uint32(counter), uint32(counter>>32), blockLen, flags
	// round 1
	s0 += s4 + m0
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m1
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m2
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m3
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m4
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m5
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m6
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m7
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m8
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m9
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m10
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m11
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m12
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m13
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m14
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m15
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	// round 2
	s0 += s4 + m2
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m6
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m3
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m10
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m7
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m0
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m4
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m13
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m1
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m11
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m12
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m5
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m9
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m14
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m15
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m8
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	// round 3
	s0 += s4 + m3
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m4
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m10
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m12
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m13
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m2
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m7
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m14
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m6
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m5
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m9
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m0
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m11
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m15
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m8
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m1
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	// round 4
	s0 += s4 + m10
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m7
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m12
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m9
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m14
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m3
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m13
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m15
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m4
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m0
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m11
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m2
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m5
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m8
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m1
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m6
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	// round 5
	s0 += s4 + m12
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m13
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m9
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m11
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m15
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m10
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m14
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m8
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m7
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m2
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m5
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m3
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m0
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m1
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m6
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m4
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	// round 6
	s0 += s4 + m9
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m14
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m11
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m5
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m8
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m12
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m15
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m1
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m13
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m3
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m0
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m10
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m2
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m6
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m4
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m7
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	// round 7
	s0 += s4 + m11
	s12 = bits.RotateLeft32(s12^s0, -16)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -12)
	s0 += s4 + m15
	s12 = bits.RotateLeft32(s12^s0, -8)
	s8 += s12
	s4 = bits.RotateLeft32(s4^s8, -7)
	s1 += s5 + m5
	s13 = bits.RotateLeft32(s13^s1, -16)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -12)
	s1 += s5 + m0
	s13 = bits.RotateLeft32(s13^s1, -8)
	s9 += s13
	s5 = bits.RotateLeft32(s5^s9, -7)
	s2 += s6 + m1
	s14 = bits.RotateLeft32(s14^s2, -16)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -12)
	s2 += s6 + m9
	s14 = bits.RotateLeft32(s14^s2, -8)
	s10 += s14
	s6 = bits.RotateLeft32(s6^s10, -7)
	s3 += s7 + m8
	s15 = bits.RotateLeft32(s15^s3, -16)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -12)
	s3 += s7 + m6
	s15 = bits.RotateLeft32(s15^s3, -8)
	s11 += s15
	s7 = bits.RotateLeft32(s7^s11, -7)
	s0 += s5 + m14
	s15 = bits.RotateLeft32(s15^s0, -16)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -12)
	s0 += s5 + m10
	s15 = bits.RotateLeft32(s15^s0, -8)
	s10 += s15
	s5 = bits.RotateLeft32(s5^s10, -7)
	s1 += s6 + m2
	s12 = bits.RotateLeft32(s12^s1, -16)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -12)
	s1 += s6 + m12
	s12 = bits.RotateLeft32(s12^s1, -8)
	s11 += s12
	s6 = bits.RotateLeft32(s6^s11, -7)
	s2 += s7 + m3
	s13 = bits.RotateLeft32(s13^s2, -16)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -12)
	s2 += s7 + m4
	s13 = bits.RotateLeft32(s13^s2, -8)
	s8 += s13
	s7 = bits.RotateLeft32(s7^s8, -7)
	s3 += s4 + m7
	s14 = bits.RotateLeft32(s14^s3, -16)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -12)
	s3 += s4 + m13
	s14 = bits.RotateLeft32(s14^s3, -8)
	s9 += s14
	s4 = bits.RotateLeft32(s4^s9, -7)
	return [8]uint32{s0 ^ s8, s1 ^ s9, s2 ^ s10, s3 ^ s11, s4 ^ s12, s5 ^ s13, s6 ^ s14, s7 ^ s15}
}
