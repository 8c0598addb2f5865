package bao

import (
	"math/rand/v2"
	"testing"
)

// Both ways of compressing a group (copied into scratch first or not,
// copyGroup) give the scalar reference's node, whichever this machine
// takes.
func TestCompressGroupBothWays(t *testing.T) {
	defer func(v bool) { copyGroup = v }(copyGroup)
	r := rand.New(rand.NewPCG(9, 10))
	var scratch [GroupSize]byte
	for _, n := range []int64{1, 1024, 1025, GroupSize - 1, GroupSize} {
		data := randBytes(r, n)
		want := compressGroupScalar(data, 77<<GroupLog)
		for _, c := range []bool{false, true} {
			copyGroup = c
			if got := compressGroup(data, 77<<GroupLog, &scratch); got != want {
				t.Fatalf("%d bytes, copyGroup %v: node differs from the scalar reference", n, c)
			}
		}
	}
}
