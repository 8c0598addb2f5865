package main

import (
	"fmt"
	"testing"
)

// --host-ram auto keeps the RAM level in pinned host memory exactly when
// the VRAM budget does not hold every expert matrix (experts are paged),
// and true or false override it; the tokens are the same either way.
func TestGenerateHostRAMAuto(t *testing.T) {
	home, manifest := tinyProcedural(t)
	gen := func(vram, hostRAM string) (bool, []int) {
		t.Helper()
		var res struct {
			HostRAM bool  `json:"hostRAM"`
			Tokens  []int `json:"tokens"`
		}
		mustRunJSON(t, home, &res, "generate", "-", "--procedural", manifest, "--engine", "gpu",
			"--vram", vram, "--host-ram="+hostRAM, "--prompt", "a", "--max-tokens", "4", "--json")
		return res.HostRAM, res.Tokens
	}
	var first []int
	for _, c := range []struct {
		vram, flag string
		want       bool
	}{{"1MiB", "auto", true}, {"1GiB", "auto", false}, {"1MiB", "false", false}, {"1GiB", "true", true}} {
		got, toks := gen(c.vram, c.flag)
		if got != c.want {
			t.Errorf("--vram %s --host-ram=%s: host RAM %v, want %v", c.vram, c.flag, got, c.want)
		}
		if first == nil {
			first = toks
		} else if fmt.Sprint(toks) != fmt.Sprint(first) {
			t.Errorf("--vram %s --host-ram=%s: tokens %v, want %v", c.vram, c.flag, toks, first)
		}
	}
	if _, err := run(t, home, "generate", "-", "--procedural", manifest, "--host-ram=maybe"); err == nil {
		t.Error("--host-ram=maybe was accepted")
	}
}
