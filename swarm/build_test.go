package swarm

import (
	"os"
	"testing"
)

// The Makefile runs the tests twice: with the patched pion (and
// RDRR_EXPECT_BIG_PACKETS=1, so a patch that silently stopped applying
// fails here) and with upstream pion (=0), the build users of `go install`
// get.
func TestBigPacketsBuilt(t *testing.T) {
	want, ok := os.LookupEnv("RDRR_EXPECT_BIG_PACKETS")
	if !ok {
		t.Skip("RDRR_EXPECT_BIG_PACKETS not set (the Makefile sets it)")
	}
	if got := BigPacketsBuilt(); got != (want == "1") {
		t.Fatalf("BigPacketsBuilt() = %v; RDRR_EXPECT_BIG_PACKETS=%s", got, want)
	}
}
