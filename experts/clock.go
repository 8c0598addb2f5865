package experts

import (
	"slices"
	"time"
)

// stepClock measures a generation's steady state: the intervals between
// the starts of its generated steps (begun with the token the step before
// sampled still on the GPU), each about the GPU's time for a step when
// Generate records a step while the GPU runs the one before it. A whole
// run's tokens a second also count its first steps, which ran several
// times slower after the GPU had idled for seconds (an H200,
// experts/BENCHMARKS.md, 2026-11-29), and the prompt's, which run one at
// a time.
type stepClock struct {
	now   func() time.Time // time.Now when nil; tests fake it
	last  time.Time        // when the last step began, if it was a generated one
	times []time.Duration
}

// start forgets the last generation's intervals.
func (c *stepClock) start() {
	c.last, c.times = time.Time{}, c.times[:0]
}

// mark counts the interval since the last step began, if that one was a
// generated step, notes when this one (generated: onGPU) begins, and
// returns the interval and whether it counted it (an A/B counts the same
// ones, abStep).
func (c *stepClock) mark(onGPU bool) (interval time.Duration, counted bool) {
	now := time.Now()
	if c.now != nil {
		now = c.now()
	}
	if counted = !c.last.IsZero(); counted {
		interval = now.Sub(c.last)
		c.times = append(c.times, interval)
	}
	c.last = time.Time{}
	if onGPU {
		c.last = now
	}
	return interval, counted
}

// StepMedian returns the median interval between the starts of the last
// generation's generated steps, and how many there were (0 where Generate
// ran one step at a time: RDRR_GPU_PIPELINE=0, or --profile-gpu).
func (g *GPUModel) StepMedian() (time.Duration, int) {
	return median(g.clock.times), len(g.clock.times)
}

// median is the middle of ts sorted (the upper one of an even count), 0
// for none.
func median(ts []time.Duration) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[len(s)/2]
}
