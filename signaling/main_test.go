package signaling

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the package if goroutines of ours (or of pion and the
// WebSocket library) outlive the tests: every session and client
// must be stopped by its owner.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := waitGoroutines(10 * time.Second); leaked != "" {
			fmt.Fprintln(os.Stderr, "goroutines leaked by the tests:\n"+leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// waitGoroutines waits until no goroutine runs code of the watched modules
// and returns the stacks of those still running after d.
func waitGoroutines(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		leaked := ours()
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func ours() []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "TestMain") {
			continue
		}
		for _, mod := range []string{"github.com/rdrr/peer/", "github.com/pion/", "github.com/coder/websocket"} {
			if strings.Contains(g, mod) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
