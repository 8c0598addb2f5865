package signaling

import (
	"os/exec"
	"strings"
	"testing"
)

// Signaling depends on nothing else of this module (DESIGN.md), and on no
// cgo, so that it embeds anywhere.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{if and .CgoFiles (not .Standard)}}cgo{{end}}", "github.com/rdrr/peer/signaling").CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, cgo, _ := strings.Cut(line, " ")
		if cgo == "cgo" {
			t.Errorf("signaling depends on %s, which uses cgo", path)
		}
		if strings.HasPrefix(path, "github.com/rdrr/peer/") && path != "github.com/rdrr/peer/signaling" {
			t.Errorf("signaling depends on %s", path)
		}
	}
}
