package kernels

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/rdrr/peer/cas"
)

// Fetcher brings a blob into the local store from peers (the swarm).
type Fetcher interface {
	// Fetch stores c locally, refusing it if it is larger than maxSize.
	// ctx cancels it. Safe for concurrent use.
	Fetch(ctx context.Context, c cas.CID, maxSize int64) error
}

// Puller takes endorsed variants for this device: it picks candidates by
// Policy from the registry's endorsements, fetches them, runs the gate
// and the benchmark here, and activates a variant only if it passes and
// is faster here too by the endorsing rule. Endorsements only decide what
// is worth trying.
type Puller struct {
	Registry  *Registry
	Store     BlobReader
	Fetcher   Fetcher // nil: only variants already in Store
	Gate      Gate
	Bench     Bench
	Policy    Policy
	Class     DeviceClass
	Baselines map[string]*Artifact // op -> built-in variant (Builtins)
	Now       func() time.Time     // nil: time.Now
	Log       *slog.Logger         // nil: discard
	// Skip, if set, passes over candidates it returns true for (a daemon
	// skips the variants it already judged: endorsements that keep
	// arriving for a refused variant cost no second gate).
	Skip func(Candidate) bool
}

// Judged reports whether err is a verdict on the variant itself (the gate,
// the benchmark, the descriptor), not a failure to get that far (a fetch,
// a cancelled context): a verdict holds on this device until the variant
// or the build changes.
func Judged(err error) bool {
	return errors.Is(err, ErrGate) || errors.Is(err, ErrTooFast) || errors.Is(err, ErrNotEndorsable) || errors.Is(err, ErrDescriptor)
}

// PullResult is what Pull did with one candidate.
type PullResult struct {
	Candidate Candidate
	Activated bool
	Speedup   Speedup // measured here (when it got that far)
	Err       error   // why not, when not activated
}

// Pull tries the candidates of op, best claim first, and activates the
// first that passes the gate and beats op's active variant here. It
// returns what happened to each candidate it looked at; an error only
// when it could not start.
func (p *Puller) Pull(ctx context.Context, op string) ([]PullResult, error) {
	if !validOp(op) {
		return nil, fmt.Errorf("%w: %q", ErrUnknownOp, op)
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	log := p.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var out []PullResult
	for _, c := range p.Policy.Candidates(p.Registry.Endorsements(), p.Class, op, now()) {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		if p.Registry.Active(op) == c.Kernel.String() || (p.Skip != nil && p.Skip(c)) {
			continue
		}
		r := PullResult{Candidate: c}
		r.Speedup, r.Err = p.try(ctx, c)
		if r.Err == nil {
			r.Err = p.Registry.Use(op, c.Kernel.String())
			r.Activated = r.Err == nil
		}
		log.Info("kernel candidate", "op", op, "variant", c.Kernel, "shape", c.Shape, "endorsers", len(c.Endorsers),
			"activated", r.Activated, "speedup", r.Speedup.Median, "err", r.Err)
		out = append(out, r)
		if r.Activated {
			break
		}
	}
	return out, nil
}

// try fetches, gates and benchmarks candidate c against op's active variant.
func (p *Puller) try(ctx context.Context, c Candidate) (Speedup, error) {
	v, err := p.load(ctx, c.Kernel)
	if err != nil {
		return Speedup{}, err
	}
	if v.Descriptor.Op != c.Op || v.Descriptor.ABI != ABIVersion(c.Op) {
		return Speedup{}, fmt.Errorf("%w: endorsed for %s ABI %d, the descriptor is %s ABI %d",
			ErrDescriptor, c.Op, ABIVersion(c.Op), v.Descriptor.Op, v.Descriptor.ABI)
	}
	base := p.Baselines[c.Op]
	if active := p.Registry.Active(c.Op); active != Builtin {
		ac, _ := cas.ParseCID(active)
		if base, err = p.load(ctx, ac); err != nil {
			return Speedup{}, fmt.Errorf("active variant: %w", err)
		}
	}
	if base == nil {
		return Speedup{}, fmt.Errorf("kernels: no baseline for %s", c.Op)
	}
	if _, err := p.Gate.Check(ctx, v, freshSeed()); err != nil {
		return Speedup{}, err
	}
	dims, err := bucketDims(c.Shape)
	if err != nil {
		return Speedup{}, err
	}
	res, err := p.Bench.Compare(ctx, v, base, dims, BenchOptions{Seed: freshSeed()})
	if err != nil {
		return Speedup{}, err
	}
	s, err := Summarize(res)
	if err != nil {
		return s, err
	}
	if s.Median < MinSpeedup || s.Low <= 1 {
		return s, fmt.Errorf("%w here: speedup %.3f, interval [%.3f, %.3f]", ErrNotEndorsable, s.Median, s.Low, s.High)
	}
	return s, nil
}

// load reads variant c, fetching its blobs first when a Fetcher is set.
func (p *Puller) load(ctx context.Context, c cas.CID) (*Artifact, error) {
	if p.Fetcher != nil {
		if err := p.Fetcher.Fetch(ctx, c, MaxDescriptorBytes); err != nil {
			return nil, err
		}
		b, err := readBlob(p.Store, c, MaxDescriptorBytes)
		if err != nil {
			return nil, err
		}
		d, err := DecodeDescriptor(b)
		if err != nil {
			return nil, err
		}
		if err := p.Fetcher.Fetch(ctx, d.WGSL, d.WGSLSize); err != nil {
			return nil, err
		}
	}
	return Load(p.Store, c)
}

// bucketDims parses a shape bucket back into its dimensions.
func bucketDims(s string) ([]int, error) {
	var dims []int
	for _, p := range strings.Split(s, "x") {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 || v > MaxDim {
			return nil, fmt.Errorf("kernels: shape %q", s)
		}
		dims = append(dims, v)
	}
	return dims, nil
}

// freshSeed is a new input seed (below 2^53, as endorsements carry it).
func freshSeed() uint64 { return rand.Uint64() & maxSafeInt }
