package swarm

import (
	"os/exec"
	"strings"
	"testing"
)

// The network layer must build without a GPU toolchain: no cgo outside the
// standard library, and none of the packages above it in DESIGN.md.
func TestDependencies(t *testing.T) {
	checkDeps(t, "github.com/rdrr/peer/swarm/...", []string{"gpu", "experts", "tiers", "kernels", "evolve", "cmd"})
}

func checkDeps(t *testing.T, pkg string, forbidden []string) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{if and .CgoFiles (not .Standard)}}cgo{{end}}", pkg).CombinedOutput()
	if err != nil {
		t.Skipf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, cgo, _ := strings.Cut(line, " ")
		if cgo == "cgo" {
			t.Errorf("%s depends on %s, which uses cgo", pkg, path)
		}
		for _, f := range forbidden {
			if strings.HasPrefix(path, "github.com/rdrr/peer/"+f) {
				t.Errorf("%s depends on %s", pkg, path)
			}
		}
	}
}
