package lab

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/kernels"
)

// inputSets is how many input sets a timed batch cycles through. Every
// dispatch in a batch reads another set than the one before it into the
// same outputs, so a kernel that skips work when its outputs already hold
// something leaves the wrong set's answer, and the check after the batch
// fails.
const inputSets = 3

// Batch sizing: a timed batch holds enough dispatches to last about
// targetBatch (so the submit and the wait are a small part), at most
// maxReps.
const (
	targetBatch = 5 * time.Millisecond
	maxReps     = 512
)

// Compare is the benchmark (kernels.Bench). On fresh inputs from
// opt.Seed (inputSets of them, none the gate saw) it checks both variants
// once, warms up, then times opt.Runs pairs of batches, candidate first
// in even pairs and baseline first in odd ones. Outputs are poisoned
// before every timed batch and the candidate's output is checked after
// each of its batches against the reference of the set its last dispatch
// read. The copy bandwidth of the device is measured in the same call and
// gives FloorNs.
func (l *Lab) Compare(ctx context.Context, cand, base *kernels.Artifact, dims []int, opt kernels.BenchOptions) (kernels.BenchResult, error) {
	res := kernels.BenchResult{Op: cand.Descriptor.Op, Dims: slices.Clone(dims), Seed: opt.Seed}
	if err := l.usable(); err != nil {
		return res, err
	}
	if base.Descriptor.Op != cand.Descriptor.Op {
		return res, fmt.Errorf("lab: candidate is %s, baseline %s", cand.Descriptor.Op, base.Descriptor.Op)
	}
	warmup, runs := opt.Warmup, opt.Runs
	if warmup <= 0 {
		warmup = 10
	}
	if runs <= 0 {
		runs = 50
	}
	runs = min(max(runs, kernels.MinRuns), kernels.MaxRuns)

	h, err := harnessOf(cand.Descriptor.Op)
	if err != nil {
		return res, err
	}
	rng := seeded(opt.Seed, cand.Descriptor.Op, "bench")
	var probs []*problem
	var sets []*buffers
	defer func() {
		for _, s := range sets {
			s.release()
		}
	}()
	for i := range inputSets {
		p, err := h.make(rng, dims)
		if err != nil {
			return res, err
		}
		if i > 0 && p.shapeKey() != probs[0].shapeKey() {
			return res, fmt.Errorf("lab: %s %v: input sets dispatch differently", cand.Descriptor.Op, dims)
		}
		var shared *buffers
		if i > 0 {
			shared = sets[0]
		}
		b, err := l.upload(p, shared)
		if err != nil {
			return res, err
		}
		probs, sets = append(probs, p), append(sets, b)
	}
	cs, bs := l.pipeSet(cand), l.pipeSet(base)
	defer cs.release()
	defer bs.release()
	cp, err := cs.of(ctx, probs[0])
	if err != nil {
		return res, err
	}
	bp, err := bs.of(ctx, probs[0])
	if err != nil {
		return res, fmt.Errorf("baseline %s: %w", base.CID, err)
	}
	for i := range inputSets {
		if _, err := l.run(ctx, cp, probs[i], sets[i]); err != nil {
			return res, fmt.Errorf("candidate on the timing inputs: %w", err)
		}
		if _, err := l.run(ctx, bp, probs[i], sets[i]); err != nil {
			return res, fmt.Errorf("baseline %s on the timing inputs: %w", base.CID, err)
		}
	}

	// Warm up, then size the batches by the slower of the two: double the
	// dispatches until a batch lasts targetBatch. A batch's submit and the
	// wait for its end cost a fixed time whatever it holds (up to the
	// device poller's longest sleep, 0.5 ms); sized by the time of one
	// dispatch, which that cost swamps, batches on an H100 held two
	// dispatches and every op timed alike (~245 us a dispatch, argmax of
	// 151936 and of 10^6 values the same). The fixed cost left in a
	// targetBatch batch only brings speedups toward 1.
	// The warmup goes one dispatch a submission: warmup dispatches of a
	// large shape in one submission can pass the time limit on a slow
	// device (ten 4096x4096x8 Q4_K products on a loaded lavapipe did).
	for _, p := range [][]*gpu.Pipeline{cp, bp} {
		for i := range warmup {
			if _, err := l.timeBatch(ctx, p, probs, sets, 1, i%inputSets); err != nil {
				return res, err
			}
		}
	}
	// At least two dispatches a batch: with one, a kernel that computes
	// only into a poisoned output would be right every time it is timed.
	reps := 2
	var t1 time.Duration // one dispatch of the slower, fixed cost included
	for {
		var tb time.Duration
		for _, p := range [][]*gpu.Pipeline{cp, bp} {
			t, err := l.timeBatch(ctx, p, probs, sets, reps, 0)
			if err != nil {
				return res, err
			}
			tb = max(tb, t)
		}
		t1 = tb / time.Duration(reps)
		if tb >= targetBatch || reps >= maxReps {
			break
		}
		reps = min(2*reps, maxReps)
	}
	if (reps-1)%inputSets == 0 {
		reps++ // the last dispatch must read another set than the first
	}
	budget := l.Budget
	if budget <= 0 {
		budget = 60 * time.Second
	}
	if per := 2 * time.Duration(reps) * t1; per > 0 && time.Duration(runs)*per > budget {
		runs = max(kernels.MinRuns, int(budget/per))
	}

	for i := range runs {
		order := [][]*gpu.Pipeline{cp, bp}
		if i%2 == 1 {
			order = [][]*gpu.Pipeline{bp, cp}
		}
		for _, p := range order {
			if err := l.poisonOutputs(probs[0], sets[0]); err != nil {
				return res, err
			}
			off := i % inputSets
			t, err := l.timeBatch(ctx, p, probs, sets, reps, off)
			if err != nil {
				return res, err
			}
			ns := max(t.Nanoseconds()/int64(reps), 1)
			if &p[0] == &bp[0] {
				res.BaselineNs = append(res.BaselineNs, ns)
				continue
			}
			res.CandidateNs = append(res.CandidateNs, ns)
			last := (off + reps - 1) % inputSets
			out, err := l.readOutputs(ctx, probs[last], sets[last])
			if err != nil {
				return res, err
			}
			if _, err := probs[last].check(out); err != nil {
				return res, gateErr("after timed run %d (%d dispatches): %v", i, reps, err)
			}
		}
	}
	// An in-place op's timed dispatches include the copy that restores
	// its binding: its bytes are part of the floor.
	fb := probs[0].bytes
	for _, bd := range probs[0].binds {
		if bd.inout {
			fb += 2 * int64(bd.size)
		}
	}
	floor, err := l.floor(ctx, fb)
	if err != nil {
		return res, fmt.Errorf("copy bandwidth: %w", err)
	}
	res.FloorNs = floor
	l.log().Debug("lab compare", "op", res.Op, "dims", dims, "runs", runs, "reps", reps, "floor_ns", floor)
	return res, nil
}

// timeBatch records reps runs of the problems with pipes, cycling through the input sets
// (each with its own uniform block) from set off, all writing the shared
// outputs (in-place bindings restored from the set's data before each),
// and returns the time from submit to completion.
func (l *Lab) timeBatch(ctx context.Context, pipes []*gpu.Pipeline, probs []*problem, sets []*buffers, reps, off int) (time.Duration, error) {
	b := l.Dev.Batch()
	for j := range reps {
		k := (off + j) % len(sets)
		s, prob := sets[k], probs[k]
		if err := s.restore(b, prob); err != nil {
			b.Drop()
			return 0, err
		}
		if err := record(b, pipes, prob, s); err != nil {
			b.Drop()
			return 0, gateErr("%v", err)
		}
	}
	start := time.Now()
	if err := b.Submit(ctx); err != nil {
		return 0, gateErr("%v", err)
	}
	if err := l.wait(ctx, "timed dispatch", l.Dev.Sync); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// floor returns the time bytes need at the device's copy bandwidth,
// measured now (the best of the copy engine and the copy kernel over
// buffers of about the op's size), divided by the Lab's slack.
func (l *Lab) floor(ctx context.Context, bytes int64) (int64, error) {
	n := (max(bytes/2, 64<<10) + 15) &^ 15
	n = min(n, 256<<20)
	src, err := l.Dev.Alloc(uint64(n))
	if err != nil {
		return 0, err
	}
	defer src.Release()
	dst, err := l.Dev.Alloc(uint64(n))
	if err != nil {
		return 0, err
	}
	defer dst.Release()
	cl, err := ops.CopyLaunch(int(n))
	if err != nil {
		return 0, err
	}
	k, err := ops.Builtin(cl.Kernel, cl.Constants)
	if err != nil {
		return 0, err
	}
	k.Name = "lab-copy"
	pipe, err := l.Dev.Compile(ctx, k)
	if err != nil {
		return 0, err
	}
	defer pipe.Release()
	best := time.Duration(1 << 62)
	reps := 1
	for try := range 6 {
		for _, engine := range []bool{true, false} {
			b := l.Dev.Batch()
			for range reps {
				if engine {
					err = b.Copy(dst, src)
				} else {
					err = b.Dispatch(pipe, cl.Groups, cl.Params, src, dst)
				}
				if err != nil {
					b.Drop()
					return 0, err
				}
			}
			start := time.Now()
			if err := b.Submit(ctx); err != nil {
				return 0, err
			}
			if err := l.wait(ctx, "copy", l.Dev.Sync); err != nil {
				return 0, err
			}
			t := time.Since(start) / time.Duration(reps)
			best = min(best, t)
		}
		if try == 0 {
			reps = int(min(max(int64(targetBatch/max(best, time.Microsecond)), 1), maxReps))
		}
	}
	// A copy reads n and writes n bytes: bandwidth 2n/best.
	slack := l.Slack
	if slack <= 0 {
		slack = 4
	}
	return max(int64(float64(bytes)*float64(best.Nanoseconds())/float64(2*n)/slack), 1), nil
}
