//go:build !amd64

package bao

import "lukechampine.com/blake3/guts"

// compressGroup returns the node of one group's data: scalar BLAKE3 off
// amd64 (compressGroupScalar).
func compressGroup(data []byte, counter uint64, scratch *[GroupSize]byte) guts.Node {
	return compressGroupScalar(data, counter)
}
