package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The store and the network must build without a GPU toolchain: they may
// not import the gpu package or the packages above them (DESIGN.md's
// dependency table), and they must build with cgo disabled, for Linux,
// macOS and Windows.
func TestDependencyArrows(t *testing.T) {
	const mod = "github.com/rdrr/peer/"
	forbidden := map[string][]string{
		"cas":       {"gpu", "experts", "swarm", "signaling", "tiers", "kernels", "evolve"},
		"signaling": {"gpu", "experts", "swarm", "cas", "tiers", "kernels", "evolve"},
		"swarm":     {"gpu", "experts", "tiers", "kernels", "evolve"},
		"gpu":       {"cas", "swarm", "signaling", "experts", "tiers", "kernels", "evolve"},
	}
	var pure []string
	for pkg, bad := range forbidden {
		if _, err := os.Stat("../../" + pkg); err != nil {
			continue
		}
		if pkg != "gpu" {
			pure = append(pure, "../../"+pkg+"/...")
		}
		out, err := exec.Command("go", "list", "-deps", "../../"+pkg+"/...").CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "matched no packages") {
				continue
			}
			t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
		}
		deps := map[string]bool{}
		for _, d := range strings.Fields(string(out)) {
			deps[d] = true
		}
		for _, b := range bad {
			for d := range deps {
				if d == mod+b || strings.HasPrefix(d, mod+b+"/") {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		}
	}
	// The GPU's references, codec and shared enumerations are pure Go too
	// (the model generator and the kernel lab's gate use them without a
	// device).
	pure = append(pure, "../../gpu/abi", "../../gpu/ref", "../../gpu/q4k")
	// Without cgo, and for the other systems the GPU targets (Metal,
	// DX12) imply: Linux-only calls stay behind build tags.
	for _, target := range []struct{ goos, goarch string }{
		{"linux", "amd64"}, {"darwin", "arm64"}, {"windows", "amd64"},
	} {
		cmd := exec.Command("go", append([]string{"build"}, pure...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+target.goos, "GOARCH="+target.goarch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%v do not build for %s/%s without cgo: %v\n%s", pure, target.goos, target.goarch, err, out)
		}
	}
}
