package main

import (
	"strings"
	"testing"
)

// RDRR_GPU_AB runs an A/B inside the GPU engine's step: --json reports
// each setting's steps and median under ab, the text output a line of
// them; an unknown toggle is refused.
func TestGenerateAB(t *testing.T) {
	home, manifest := tinyProcedural(t)
	args := []string{"generate", "-", "--procedural", manifest, "--prompt", "a", "--max-tokens", "30", "--engine", "gpu", "--vram", "1GiB"}
	t.Setenv("RDRR_GPU_AB", "l2")
	var res struct {
		StepMedian   int64 `json:"stepMedianNs"`
		StepMedianOf int   `json:"stepMedianOf"`
		Dispatches   int   `json:"dispatches"`
		Barriers     int   `json:"barriers"`
		AB           struct {
			Toggle string `json:"toggle"`
			Period int    `json:"period"`
			On     struct {
				Steps  int   `json:"steps"`
				Median int64 `json:"medianNs"`
			} `json:"on"`
			Off struct {
				Steps  int   `json:"steps"`
				Median int64 `json:"medianNs"`
			} `json:"off"`
		} `json:"ab"`
	}
	mustRunJSON(t, home, &res, append(args, "--json")...)
	if ab := res.AB; ab.Toggle != "l2" || ab.Period != 10 || ab.On.Steps == 0 || ab.Off.Steps == 0 || ab.On.Median <= 0 || ab.Off.Median <= 0 {
		t.Fatalf("ab: %+v", ab)
	}
	// The steady state beside it: the median of every generated step's
	// interval (30 tokens: 28).
	if res.StepMedian <= 0 || res.StepMedianOf != 28 {
		t.Fatalf("stepMedianNs %d of %d; want a median of 28", res.StepMedian, res.StepMedianOf)
	}
	// And the dispatches, some of them beside the one before (the L2
	// prefetch beside the norm, at least).
	if res.Dispatches <= 0 || res.Barriers <= 0 || res.Barriers >= res.Dispatches {
		t.Fatalf("%d dispatches, %d after a barrier", res.Dispatches, res.Barriers)
	}
	out := mustRun(t, home, args...)
	for _, want := range []string{"A/B inside the step (RDRR_GPU_AB=l2, alternated every 10 steps): on ", "  median step ", "  dispatches per step: "} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	t.Setenv("RDRR_GPU_AB", "bogus")
	if _, err := run(t, home, args...); err == nil || !strings.Contains(err.Error(), `no A/B toggle "bogus"`) {
		t.Fatalf("RDRR_GPU_AB=bogus: %v", err)
	}
}
