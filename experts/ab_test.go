package experts

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/tiers"
)

// An A/B inside the step alternates its toggle every ABPeriod steps, off
// first, and counts the intervals between generated steps' starts (not
// the prompt's), but the first abSettle after each switch, for the
// setting of the step that began each (a fake clock that runs slower
// with the toggle on tells them apart); a toggle that keeps the step's
// bits keeps the tokens (greedy, every expert resident: one pipelined
// step after another). SetAB("") sets the toggle back as it was; an
// unknown toggle, or one that needs the experts' q8 without it, is
// refused, and SetActivations starts an A/B again from its setting.
func TestGPUModelAB(t *testing.T) {
	d, m, src := endlessTiny(t)
	ctx := context.Background()
	prompt := ByteTokens("The swarm is here") // its last step at a counted place of a block, were it counted
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
		if a := g.ab; a != nil {
			// A step takes 2 ms with the toggle on, 1 ms off (the step
			// clock reads before the toggle is set for the next step).
			var now time.Time
			g.clock.now = func() time.Time {
				now = now.Add(time.Millisecond)
				if *a.flag {
					now = now.Add(time.Millisecond)
				}
				return now
			}
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
			probe, _ := testGPUModel(t, d, m, src, 3)
			before := abSetting(probe, toggle) // as the environment has it
			got, g := generate(toggle)
			if !slices.Equal(got, want) {
				t.Fatalf("tokens %v; without the A/B %v", got, want)
			}
			r, ok := g.AB()
			if !ok || r.Toggle != toggle || r.Period != ABPeriod {
				t.Fatalf("AB() = %+v, %v", r, ok)
			}
			steps := g.ab.steps
			if steps != len(prompt)+n-1 { // the last token is not embedded
				t.Fatalf("%d steps begun; the generation has %d", steps, len(prompt)+n-1)
			}
			var on, off int // intervals counted: from each generated step to the next, but the settling ones
			for i := len(prompt); i < steps-1; i++ {
				switch {
				case i%ABPeriod < abSettle:
				case (i/ABPeriod)%2 == 1:
					on++
				default:
					off++
				}
			}
			if r.On.Steps != on || r.Off.Steps != off || on == 0 || r.On.Median != 2*time.Millisecond || r.Off.Median != time.Millisecond {
				t.Fatalf("%+v; want %d steps on at 2ms and %d off at 1ms", r, on, off)
			}
			for side, want := range map[int]time.Duration{0: time.Millisecond, 1: 2 * time.Millisecond} {
				for i, d := range g.ab.times[side] {
					if d != want {
						t.Fatalf("interval %d of side %d: %v; want %v (every one, not only the median)", i, side, d, want)
					}
				}
			}
			// A second generation does not count the time from the first's
			// last step (it would be huge here).
			g.clock.last = time.Time{}.Add(-time.Hour) // an hour before the fake clock's first reading
			if _, err := g.Generate(ctx, prompt[:2], 2, Sampling{}, nil); err != nil {
				t.Fatal(err)
			}
			for side := range g.ab.times {
				for _, d := range g.ab.times[side] {
					if d > 2*time.Millisecond {
						t.Fatalf("side %d counted %v: the gap between generations", side, d)
					}
				}
			}
			steps = g.ab.steps
			// The last step ran with the setting of its block.
			last := ((steps-1)/ABPeriod)%2 == 1
			if got := abSetting(g, toggle); got != last {
				t.Fatalf("after %d steps the toggle is %v; want %v", steps, got, last)
			}
			if err := g.SetAB(""); err != nil || abSetting(g, toggle) != before {
				t.Fatalf("SetAB(\"\"): %v, toggle %v; want %v as before", err, abSetting(g, toggle), before)
			}
			if _, ok := g.AB(); ok {
				t.Fatal("AB() after SetAB(\"\") reports one")
			}
		})
	}
	g, _ := testGPUModel(t, d, m, src, 3)
	if err := g.SetAB("bogus"); err == nil {
		t.Fatal("SetAB(\"bogus\") accepted")
	}
	if !g.xq {
		t.Skip("the experts' q8 is off (RDRR_GPU_XQ=0): xqattn and SetActivations' A/B need it")
	}
	// Toggles that change the step's bits (the attention's products of
	// quantized x; the router beside the norm, which sums in another
	// order; the LM head of quantized x) run too, each setting counted,
	// the toggle set back after.
	for _, toggle := range []string{"xqattn", "routenorm", "xqhead"} {
		was := abSetting(g, toggle)
		if _, g := generate(toggle); g.ab == nil {
			t.Fatalf("%s: no A/B", toggle)
		} else if r, _ := g.AB(); r.On.Steps == 0 || r.Off.Steps == 0 {
			t.Fatalf("%s: %+v", toggle, r)
		} else if err := g.SetAB(""); err != nil || abSetting(g, toggle) != was {
			t.Fatalf("%s after SetAB(\"\"): %v, %v; want %v, as before", toggle, err, abSetting(g, toggle), was)
		}
	}
	// SetActivations: q8 starts it again with xqattn on as its setting;
	// f32 leaves yq no meaning.
	if err := g.SetAB("xqattn"); err != nil {
		t.Fatal(err)
	}
	if err := g.SetActivations(ctx, "q8"); err != nil || g.ab == nil || !g.ab.was {
		t.Fatalf("SetActivations(q8) with an A/B of xqattn: %v, %+v", err, g.ab)
	}
	if err := g.SetAB("yq"); err != nil {
		t.Fatal(err)
	}
	if err := g.SetActivations(ctx, "f32"); err == nil {
		t.Fatal("SetActivations(f32) with an A/B of yq accepted")
	}
	if err := g.SetAB("yq"); err == nil {
		t.Fatal("yq accepted without xq")
	}
	// q8-experts leaves xqhead no meaning (the head reads float x).
	if err := g.SetActivations(ctx, "q8-experts"); err != nil {
		t.Fatal(err)
	}
	if err := g.SetAB("xqhead"); err == nil {
		t.Fatal("xqhead accepted with q8-experts activations")
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
	case "routenorm":
		return g.routeNorm
	case "xqhead":
		return g.xqHead
	}
	panic(toggle)
}

// StepMedian is the median interval between the starts of the last
// generation's generated steps: a fake clock that takes 1 ms a step and
// 4 ms at every fourth gives 1 ms, of n - 2 intervals for n tokens (the
// last token is not embedded; the prompt's steps run one at a time), the
// last generation's only; none when steps run one at a time.
func TestGPUModelStepMedian(t *testing.T) {
	d, m, src := endlessTiny(t)
	ctx := context.Background()
	g, cache := testGPUModel(t, d, m, src, ExpertMatrices(m))
	if err := cache.Warm(ctx, g.ExpertKeys(), 0, 2, nil); err != nil {
		t.Fatal(err)
	}
	var now time.Time
	calls := 0
	g.clock.now = func() time.Time {
		calls++
		now = now.Add(time.Millisecond)
		if calls%4 == 0 {
			now = now.Add(3 * time.Millisecond)
		}
		return now
	}
	for _, n := range []int{12, 7} {
		if _, err := g.Generate(ctx, ByteTokens("swarm"), n, Sampling{}, nil); err != nil {
			t.Fatal(err)
		}
		if med, k := g.StepMedian(); med != time.Millisecond || k != n-2 {
			t.Fatalf("%d tokens: median %v of %d; want 1ms of %d", n, med, k, n-2)
		}
	}
	g.pipeline = false
	if _, err := g.Generate(ctx, ByteTokens("swarm"), 5, Sampling{}, nil); err != nil {
		t.Fatal(err)
	}
	if med, k := g.StepMedian(); k != 0 {
		t.Fatalf("one step at a time: median %v of %d; want none", med, k)
	}
}

// endlessTiny is a device and tiny-moe without its tokenizer: no end of
// text, so that every step of a generation runs.
func endlessTiny(t *testing.T) (*gpu.Device, *Manifest, tiers.Source) {
	d := openTestDevice(t, 0)
	m, src := tinyInStore(t, 1)
	tk := m.Tokenizer
	t.Cleanup(func() { m.Tokenizer = tk })
	m.Tokenizer = nil
	return d, m, src
}
