package experts

import (
	"context"
	"slices"
	"testing"
)

// An A/B inside the step alternates its toggle every ABPeriod steps, off
// first, and counts every step but the first abSettle after each switch
// for the setting it ran with; a toggle that keeps the step's bits keeps
// the tokens (greedy, every expert resident: one pipelined step after
// another). SetAB("") leaves the toggle on; an unknown toggle is refused.
func TestGPUModelAB(t *testing.T) {
	d := openTestDevice(t, 0)
	m, src := tinyInStore(t, 1)
	defer func(tk *Tokenizer) { m.Tokenizer = tk }(m.Tokenizer)
	m.Tokenizer = nil // no end of text: every step runs
	ctx := context.Background()
	prompt := ByteTokens("The swarm is")
	n := 3*ABPeriod + 7
	if raceEnabled && testing.Short() {
		n = ABPeriod + 3
	}
	slots := ExpertMatrices(m)
	generate := func(toggle string) ([]int, *GPUModel) {
		g, cache := testGPUModel(t, d, m, src, slots)
		if err := cache.Warm(ctx, g.ExpertKeys(), 0, 2, nil); err != nil {
			t.Fatal(err)
		}
		if err := g.SetAB(toggle); err != nil {
			t.Fatal(err)
		}
		toks, err := g.Generate(ctx, prompt, n, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return toks, g
	}
	want, _ := generate("")
	for _, toggle := range []string{"l2", "rope", "yq"} {
		t.Run(toggle, func(t *testing.T) {
			got, g := generate(toggle)
			if !slices.Equal(got, want) {
				t.Fatalf("tokens %v; without the A/B %v", got, want)
			}
			r, ok := g.AB()
			if !ok || r.Toggle != toggle || r.Period != ABPeriod {
				t.Fatalf("AB() = %+v, %v", r, ok)
			}
			steps := g.ab.steps
			if steps < len(prompt)+n-1 { // the last token is not embedded
				t.Fatalf("%d steps begun; the generation has %d", steps, len(prompt)+n-1)
			}
			var on, off int // steps counted: every one with a later step, but the settling ones
			for i := range steps - 1 {
				switch {
				case i%ABPeriod < abSettle:
				case (i/ABPeriod)%2 == 1:
					on++
				default:
					off++
				}
			}
			if r.On.Steps != on || r.Off.Steps != off || on == 0 || r.On.Median <= 0 || r.Off.Median <= 0 {
				t.Fatalf("%+v; want %d steps on and %d off, each with a median", r, on, off)
			}
			// The last step ran with the setting of its block.
			last := ((steps-1)/ABPeriod)%2 == 1
			if got := abSetting(g, toggle); got != last {
				t.Fatalf("after %d steps the toggle is %v; want %v", steps, got, last)
			}
			if err := g.SetAB(""); err != nil || !abSetting(g, toggle) {
				t.Fatalf("SetAB(\"\"): %v, toggle %v; want it on as before", err, abSetting(g, toggle))
			}
			if _, ok := g.AB(); ok {
				t.Fatal("AB() after SetAB(\"\") reports one")
			}
		})
	}
	// A toggle that changes the step's bits (the attention's products of
	// quantized x) runs too, each setting counted.
	// SetAB("") sets it back off, as it was.
	if _, g := generate("xqattn"); g.ab == nil {
		t.Fatal("xqattn: no A/B")
	} else if r, _ := g.AB(); r.On.Steps == 0 || r.Off.Steps == 0 {
		t.Fatalf("xqattn: %+v", r)
	} else if err := g.SetAB(""); err != nil || g.xqAttn {
		t.Fatalf("xqattn after SetAB(\"\"): %v, %v; want off, as before", err, g.xqAttn)
	}
	g, _ := testGPUModel(t, d, m, src, 3)
	if err := g.SetAB("bogus"); err == nil {
		t.Fatal("SetAB(\"bogus\") accepted")
	}
	g.xq = false
	if err := g.SetAB("xqattn"); err == nil {
		t.Fatal("xqattn accepted without xq")
	}
}

// abSetting is toggle's setting in g (true: the feature in use).
func abSetting(g *GPUModel, toggle string) bool {
	switch toggle {
	case "l2":
		return g.l2Router
	case "rope":
		return g.ropeAttn
	case "yq":
		return g.yq
	case "xqattn":
		return g.xqAttn
	}
	panic(toggle)
}
