package gpu

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps: gpu and its sub-packages import nothing else from this
// repository (DESIGN.md: gpu depends on nothing), so experts/, tiers/ and
// kernels/ can build on it without cycles.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./...").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/rdrr/peer/") && p != "github.com/rdrr/peer/gpu" && !strings.HasPrefix(p, "github.com/rdrr/peer/gpu/") {
			t.Errorf("gpu depends on %s", p)
		}
	}
}
