package experts

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/rdrr/peer/gpu/ops"
)

// An A/B inside the decode step: one of the step's toggles alternated
// every ABPeriod steps of one generation, off first, and the intervals
// between the starts of generated steps (not the prompt's, which the host
// runs one at a time) counted for the setting of their block, the first
// abSettle intervals after each switch left out. When Generate records a
// step while the GPU runs the one before it, such an interval is about
// the GPU's time for the step before: the first interval of a block
// measures the last step of the block before, so abSettle must stay at
// least 1 (the second may compile a pipeline the switch needs). Both
// settings see the same GPU and clocks, at positions that alternate in
// blocks, and with a toggle that keeps the step's bits (l2, rope, yq) the
// same tokens: a kernel benchmark times a kernel after itself, and on an
// H200 that did not predict its cost between its neighbours in the step
// (experts/BENCHMARKS.md, 2026-11-29). RDRR_GPU_AB names the toggle.

// ABPeriod is how many steps an A/B runs each setting in turn.
const ABPeriod = 10

// abSettle is how many intervals after each switch an A/B does not count
// (at least 1: see above).
const abSettle = 2

// abToggle is a toggle an A/B alternates: a field of the model, true
// when the feature is in use (the default for all of them but l2), and
// whether it means anything only with the experts' q8 activations (xq).
type abToggle struct {
	field  func(g *GPUModel) *bool
	needXQ bool
}

// abToggles are the toggles an A/B alternates, by name.
var abToggles = map[string]abToggle{
	"l2":        {func(g *GPUModel) *bool { return &g.l2Router }, false},   // the router's L2 prefetch
	"ffn":       {func(g *GPUModel) *bool { return &g.fusedFFN }, true},    // a resident layer's gate, up and down products in one dispatch
	"rope":      {func(g *GPUModel) *bool { return &g.ropeAttn }, false},   // RoPE and the KV store in the attention's split
	"yq":        {func(g *GPUModel) *bool { return &g.yq }, true},          // gate and up products quantizing their output
	"router":    {func(g *GPUModel) *bool { return &g.fuseRouter }, false}, // the router's product in its routing dispatch
	"accnorm":   {func(g *GPUModel) *bool { return &g.accNorm }, true},     // accumulates deferred to the next norm
	"xqattn":    {func(g *GPUModel) *bool { return &g.xqAttn }, true},      // q8 activations for the attention's products too (and so the LM head's, with xqhead)
	"xqhead":    {func(g *GPUModel) *bool { return &g.xqHead }, true},      // q8 activations for the LM head too (needs xqattn on)
	"routenorm": {func(g *GPUModel) *bool { return &g.routeNorm }, true},   // the router beside the FFN norm, normalizing x + o itself (router's and accnorm's off sides turn it off too)
}

// ABToggles lists the toggles an A/B can alternate.
func ABToggles() []string { return slices.Sorted(maps.Keys(abToggles)) }

// ABResult is an A/B's outcome so far.
type ABResult struct {
	Toggle string `json:"toggle"`
	Period int    `json:"period"`
	On     ABSide `json:"on"`
	Off    ABSide `json:"off"`
}

// ABSide is one setting's steps counted and their median interval.
type ABSide struct {
	Steps  int           `json:"steps"`
	Median time.Duration `json:"medianNs"`
}

type abTest struct {
	toggle string
	flag   *bool              // the toggle's field
	was    bool               // its setting before the A/B
	steps  int                // steps begun
	times  [2][]time.Duration // by setting: 0 off, 1 on
}

// SetAB starts an A/B of toggle (one of ABToggles) from the next step on,
// after stopping one that runs; "" stops one and sets its toggle back as
// it was. SetActivations starts it again from its own setting.
func (g *GPUModel) SetAB(toggle string) error {
	tg, ok := abToggles[toggle]
	switch {
	case toggle != "" && !ok:
		return fmt.Errorf("experts: no A/B toggle %q (toggles: %s)", toggle, strings.Join(ABToggles(), ", "))
	case tg.needXQ && !g.xq:
		return fmt.Errorf("experts: the A/B toggle %s needs the experts' q8 activations (RDRR_GPU_XQ not 0, activations not f32)", toggle)
	case toggle == "xqhead" && !g.xqAttn:
		return fmt.Errorf("experts: the A/B toggle xqhead needs q8 activations for every product (not q8-experts: the LM head reads float x then)")
	case toggle == "routenorm" && g.ffnBufs == nil:
		return fmt.Errorf("experts: the A/B toggle routenorm: this model's router cannot run beside its norm (softmax routing of at most %d experts, no shared experts)", ops.MaxRouterNormExperts)
	}
	if g.ab != nil {
		*g.ab.flag = g.ab.was
		g.ab = nil
	}
	if toggle == "" {
		return nil
	}
	f := tg.field(g)
	g.ab = &abTest{toggle: toggle, flag: f, was: *f}
	return nil
}

// abStep counts interval, the step clock's since the last step began
// (counted: both were generated steps, stepClock.mark), for the last
// step's setting, and sets the toggle for the step beginning now.
func (g *GPUModel) abStep(interval time.Duration, counted bool) {
	a := g.ab
	if prev := a.steps - 1; counted && prev%ABPeriod >= abSettle {
		on := (prev / ABPeriod) % 2 // off first
		a.times[on] = append(a.times[on], interval)
	}
	*a.flag = (a.steps/ABPeriod)%2 == 1
	a.steps++
}

// AB returns the A/B's outcome so far; ok is false without one.
func (g *GPUModel) AB() (r ABResult, ok bool) {
	a := g.ab
	if a == nil {
		return ABResult{}, false
	}
	side := func(ts []time.Duration) ABSide { return ABSide{Steps: len(ts), Median: median(ts)} }
	return ABResult{Toggle: a.toggle, Period: ABPeriod, On: side(a.times[1]), Off: side(a.times[0])}, true
}
