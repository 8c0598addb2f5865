package main

import (
	"fmt"
	"testing"
)

// --activations picks what the GPU engine's Q4_K products read and says
// so in --json: f32 gives the float64 reference engine's greedy tokens
// (the exact arithmetic), q8 (the default) runs every product of the
// layers of quantized x, q8-experts only the experts' products so;
// a value other than q8, q8-experts or f32, or the flag without --engine gpu, is
// refused.
func TestGenerateActivations(t *testing.T) {
	home, manifest := tinyProcedural(t)
	gen := func(flags ...string) (string, []int) {
		t.Helper()
		var res struct {
			Activations string `json:"activations"`
			Tokens      []int  `json:"tokens"`
		}
		mustRunJSON(t, home, &res, append([]string{"generate", "-", "--procedural", manifest, "--prompt", "a", "--max-tokens", "6", "--json"}, flags...)...)
		return res.Activations, res.Tokens
	}
	_, ref := gen()
	if a, toks := gen("--engine", "gpu", "--vram", "1GiB", "--activations", "f32"); a != "f32" || fmt.Sprint(toks) != fmt.Sprint(ref) {
		t.Errorf("--activations f32: %q, tokens %v; want f32 and the reference's %v", a, toks, ref)
	}
	if a, toks := gen("--engine", "gpu", "--vram", "1GiB"); a != "q8" || len(toks) != 6 {
		t.Errorf("default: %q, %d tokens; want q8 and 6", a, len(toks))
	}
	for _, want := range []string{"q8", "q8-experts"} {
		if a, toks := gen("--engine", "gpu", "--vram", "1GiB", "--activations", want); a != want || len(toks) != 6 {
			t.Errorf("--activations %s: %q, %d tokens", want, a, len(toks))
		}
	}
	for _, bad := range [][]string{{"--engine", "gpu", "--activations", "f16"}, {"--activations", "f32"}} {
		if _, err := run(t, home, append([]string{"generate", "-", "--procedural", manifest, "--prompt", "a"}, bad...)...); err == nil {
			t.Errorf("%v was accepted", bad)
		}
	}
}

// --warm ends keeping the GPU busy for warmBusy (an idle GPU's clocks
// take a while to rise) and says so in --json; without --warm nothing is.
func TestGenerateWarmBusy(t *testing.T) {
	home, manifest := tinyProcedural(t)
	for _, warm := range []bool{true, false} {
		var res struct {
			Seconds float64 `json:"warmBusySeconds"`
			Copies  int     `json:"warmBusyCopies"`
			Tokens  []int   `json:"tokens"`
		}
		args := []string{"generate", "-", "--procedural", manifest, "--prompt", "a", "--max-tokens", "4", "--json", "--engine", "gpu", "--vram", "1GiB"}
		if warm {
			args = append(args, "--warm")
		}
		mustRunJSON(t, home, &res, args...)
		switch {
		case len(res.Tokens) != 4:
			t.Errorf("--warm %v: %d tokens", warm, len(res.Tokens))
		case warm && (res.Seconds < warmBusy.Seconds() || res.Copies <= 0):
			t.Errorf("--warm: the GPU kept busy %.3fs (%d copies); want at least %v", res.Seconds, res.Copies, warmBusy)
		case !warm && (res.Seconds != 0 || res.Copies != 0):
			t.Errorf("no --warm: the GPU kept busy %.3fs (%d copies)", res.Seconds, res.Copies)
		}
	}
}
