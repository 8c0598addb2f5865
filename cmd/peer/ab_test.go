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
		AB struct {
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
	if out := mustRun(t, home, args...); !strings.Contains(out, "A/B inside the step (RDRR_GPU_AB=l2, alternated every 10 steps): on ") {
		t.Fatalf("no A/B line in:\n%s", out)
	}
	t.Setenv("RDRR_GPU_AB", "bogus")
	if _, err := run(t, home, args...); err == nil || !strings.Contains(err.Error(), `no A/B toggle "bogus"`) {
		t.Fatalf("RDRR_GPU_AB=bogus: %v", err)
	}
}
