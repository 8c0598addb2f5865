// Package leakcheck fails a test binary whose tests leave goroutines
// running: every goroutine must have an owner that stops it (STYLE.md).
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Main runs the tests, then waits up to 10 s for every goroutine running
// code of the given module path prefixes (for example "github.com/pion/")
// to end; it exits non-zero, printing their stacks, if some remain. Call it
// from TestMain.
func Main(m *testing.M, modules ...string) {
	code := m.Run()
	if code == 0 {
		if leaked := wait(10*time.Second, modules); leaked != "" {
			fmt.Fprintln(os.Stderr, "goroutines leaked by the tests:\n"+leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func wait(d time.Duration, modules []string) string {
	deadline := time.Now().Add(d)
	for {
		leaked := running(modules)
		if len(leaked) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// running returns the stacks of goroutines in modules, other than the
// test runner's own.
func running(modules []string) []string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "TestMain") {
			continue
		}
		for _, mod := range modules {
			if strings.Contains(g, mod) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}
