package bao

import (
	"math/rand/v2"
	"testing"

	"lukechampine.com/blake3/guts"
)

// The scalar group compression (what non-amd64 builds, the browser peer's
// WebAssembly among them, verify with) against guts on every length from 0
// to a group and a spread of counters.
func TestCompressGroupScalar(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, GroupSize)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var scratch [GroupSize]byte
	step := 1
	if testing.Short() {
		step = 7
	}
	for n := 0; n <= GroupSize; n += step {
		counter := uint64(r.IntN(1<<20)) << GroupLog
		if n%5 == 0 {
			counter |= 1 << 40 // a counter's high word matters too
		}
		copy(scratch[:], data[:n])
		want := guts.CompressBuffer(&scratch, n, &guts.IV, counter, 0)
		if got := compressGroupScalar(data[:n], counter); got != want {
			t.Fatalf("%d bytes at counter %d: node %+v; want %+v", n, counter, got, want)
		}
	}
}
