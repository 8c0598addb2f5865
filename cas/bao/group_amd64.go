package bao

import (
	"golang.org/x/sys/cpu"
	"lukechampine.com/blake3/guts"
)

// copyGroup: the group is copied into scratch before it is compressed
// where guts compresses with AVX2 (no AVX-512). The 8-way compression
// reads chunks 1 KiB apart, which the hardware prefetcher served badly
// from memory on the 2-core AMD EPYC dev machine, and a sequential copy
// into a cache-hot buffer made the step ~20% faster there (64 MiB input:
// 2.04 -> 2.50 GB/s). With AVX-512 (the Intel Xeon dev machine since)
// the copy is what costs: without it, decoding a 1 MiB slice went from
// 1.07x to 1.21x the reference's speed and encoding 64 MiB from 1.11x to
// 1.34x (BenchmarkDecodeSlice, BenchmarkEncoder; 4 runs each).
var copyGroup = !cpu.X86.HasAVX512F

// compressGroup returns the node of one group's data: SIMD (AVX-512 or
// AVX2) through guts on amd64.
func compressGroup(data []byte, counter uint64, scratch *[GroupSize]byte) guts.Node {
	if len(data) == GroupSize && !copyGroup {
		return guts.CompressBuffer((*[GroupSize]byte)(data), len(data), &guts.IV, counter, 0)
	}
	copy(scratch[:], data)
	return guts.CompressBuffer(scratch, len(data), &guts.IV, counter, 0)
}
