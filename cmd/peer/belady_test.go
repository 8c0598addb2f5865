package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdrr/peer/tiers"
)

// A paged run reports Belady's MIN on its own demands at its VRAM budget,
// the same as a replay of the trace it writes; a run whose VRAM holds
// every matrix it uses reports none (its misses are first loads).
func TestGenerateReportsBelady(t *testing.T) {
	home, manifest := tinyProcedural(t)
	type result struct {
		Levels []tiers.LevelStats `json:"levels"`
		Belady *struct {
			Budget  int64   `json:"budget"`
			HitRate float64 `json:"hitRate"`
			OfMin   float64 `json:"ofMin"`
		} `json:"belady"`
	}
	trace := filepath.Join(t.TempDir(), "t.trace")
	var res result
	mustRunJSON(t, home, &res, "generate", "-", "--procedural", manifest, "--engine", "gpu",
		"--vram", "1MiB", "--prompt", "a", "--max-tokens", "8", "--trace", trace, "--json")
	vram := res.Levels[tiers.VRAM]
	if res.Belady == nil || vram.Misses == 0 {
		t.Fatalf("--vram 1MiB: belady %+v, VRAM %+v; want a report where experts were paged", res.Belady, vram)
	}
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := tiers.ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	// MIN over the experts' accesses only: the dense tensors' reads at
	// load are in the trace too, and never go to the VRAM level.
	ex := tr.Grouped()
	if len(ex.Accesses) == 0 || len(ex.Accesses) == len(tr.Accesses) {
		t.Fatalf("%d of the trace's %d accesses are of keys in a group; want the experts' and the dense tensors' both", len(ex.Accesses), len(tr.Accesses))
	}
	want := tiers.Belady(ex, vram.Budget)
	if res.Belady.Budget != vram.Budget || res.Belady.HitRate != want.HitRate || want.HitRate <= 0 {
		t.Fatalf("belady %+v; the trace replayed at the VRAM budget %d gives %+v", *res.Belady, vram.Budget, want)
	}
	if math.Abs(res.Belady.OfMin-vram.HitRate/want.HitRate) > 1e-12 {
		t.Fatalf("ofMin %v; VRAM hit rate %v over MIN's %v", res.Belady.OfMin, vram.HitRate, want.HitRate)
	}
	res = result{}
	mustRunJSON(t, home, &res, "generate", "-", "--procedural", manifest, "--engine", "gpu",
		"--vram", "1GiB", "--prompt", "a", "--max-tokens", "4", "--json")
	if res.Belady != nil {
		t.Fatalf("--vram 1GiB (nothing paged): belady %+v", *res.Belady)
	}
}

// --prefetch-sure is a rate: 0 to 1; NaN, negatives and values above 1
// (a lead in logits, as it was before it became a rate) are refused.
func TestGeneratePrefetchSureRange(t *testing.T) {
	home, manifest := tinyProcedural(t)
	for _, bad := range []string{"NaN", "-0.1", "1.5", "Inf"} {
		if _, err := run(t, home, "generate", "-", "--procedural", manifest, "--engine", "gpu", "--max-tokens", "1", "--prefetch-sure", bad); err == nil {
			t.Errorf("--prefetch-sure %s was accepted", bad)
		}
	}
	for _, ok := range []string{"0", "1", "0.85"} {
		var res struct{ Tokens []int }
		mustRunJSON(t, home, &res, "generate", "-", "--procedural", manifest, "--engine", "gpu", "--vram", "1MiB", "--prompt", "a", "--max-tokens", "2", "--prefetch-sure", ok, "--json")
		if len(res.Tokens) != 2 {
			t.Errorf("--prefetch-sure %s: tokens %v", ok, res.Tokens)
		}
	}
}

// tiers simulate --with-prefetches replays every prefetch (the flag
// alone), or those the run sent to one level and those whose level the
// trace does not say (=vram, =ram); anything else is refused.
func TestSimulateWithPrefetchesTo(t *testing.T) {
	home := t.TempDir()
	trace := filepath.Join(home, "t.trace")
	if err := os.WriteFile(trace, []byte("# rdrr-trace/1\nk 0 5 a\nk 1 5 b\nk 2 5 c\nk 3 5 d\np 0 1 vram\np 0 3 vram\np 0 2 ram\np 0 0\na 0 1\na 0 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	prefetches := func(flag string) int {
		t.Helper()
		var res struct{ Results []tiers.SimResult }
		mustRunJSON(t, home, &res, "tiers", "simulate", "--trace", trace, "--budget", "1", flag, "--json")
		n := -1
		for _, r := range res.Results {
			if r.Policy == "lru" {
				n = r.Prefetches
			}
		}
		return n
	}
	for flag, want := range map[string]int{"--with-prefetches": 4, "--with-prefetches=vram": 3, "--with-prefetches=ram": 2, "--with-prefetches=false": 0} {
		if got := prefetches(flag); got != want {
			t.Errorf("%s: %d prefetches replayed; want %d", flag, got, want)
		}
	}
	if _, err := run(t, home, "tiers", "simulate", "--trace", trace, "--with-prefetches=disk"); err == nil {
		t.Error("--with-prefetches=disk was accepted")
	}
	if _, err := run(t, home, "tiers", "simulate", "--trace", trace, "--with-prefetches", "vram"); err == nil || !strings.Contains(err.Error(), "--with-prefetches=vram") {
		t.Errorf("--with-prefetches vram (a space): %v; want the = named", err)
	}
}

// tiers simulate leaves out the accesses of keys in no group (a model's
// dense tensors in a recorded trace) where other keys have groups; a
// trace with no groups at all replays whole.
func TestSimulateLeavesDenseOut(t *testing.T) {
	home := t.TempDir()
	for _, c := range []struct {
		trace    string
		accesses int
	}{
		{"# rdrr-trace/1\nk 0 100 dense\nk 1 5 a 0\nk 2 5 b 1\na 0 0\na 0 1\na 0 2\na 1 1\n", 3},
		{"# rdrr-trace/1\nk 0 100 dense\nk 1 5 a\nk 2 5 b\na 0 0\na 0 1\na 0 2\na 1 1\n", 4},
	} {
		trace := filepath.Join(home, "t.trace")
		if err := os.WriteFile(trace, []byte(c.trace), 0o644); err != nil {
			t.Fatal(err)
		}
		var res struct{ Accesses int }
		mustRunJSON(t, home, &res, "tiers", "simulate", "--trace", trace, "--budget", "0.5", "--json")
		if res.Accesses != c.accesses {
			t.Errorf("%q: %d accesses replayed; want %d", c.trace, res.Accesses, c.accesses)
		}
	}
}
