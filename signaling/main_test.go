package signaling

import (
	"testing"

	"github.com/rdrr/peer/internal/leakcheck"
)

// TestMain fails the package if goroutines of ours (or of pion and the
// WebSocket library) outlive the tests: every session and client
// must be stopped by its owner.
func TestMain(m *testing.M) {
	leakcheck.Main(m, "github.com/rdrr/peer/", "github.com/pion/", "github.com/coder/websocket")
}
