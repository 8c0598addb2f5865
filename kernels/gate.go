package kernels

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// This file fixes the shape of the correctness gate and the benchmark
// (kernels/lab implements them on the gpu runtime), and builds what needs
// no GPU: the statistics of a comparison and the endorsement made from it.

// ErrGate is wrapped by every refusal of the gate, and by a benchmark
// whose after-timing check fails.
var ErrGate = errors.New("kernels: variant failed the correctness gate")

// ErrTooFast is wrapped when a timing is below the roofline floor: a
// measurement error or a cheat, never an endorsement.
var ErrTooFast = errors.New("kernels: timing below the roofline floor")

// Gate checks that a variant computes its op correctly on this device.
//
// An implementation must, on every call:
//   - draw fresh inputs from seed (the caller passes a new seed each time;
//     endorsements record it), for several shapes of the op including
//     awkward ones: not multiples of the workgroup, smaller than one
//     workgroup, one row or token, the largest the op allows;
//   - poison every output buffer (a NaN pattern) before each dispatch, so
//     a kernel that writes nothing, or only part, cannot pass on old
//     results;
//   - compare every output with the op's float64 reference (gpu/ref) under
//     the op's tolerance;
//   - survive the kernel: a compile error, a dispatch past its time limit,
//     an out-of-bounds access (guard bytes around every buffer, checked
//     after the run) or a lost device rejects the variant with an error
//     wrapping ErrGate, and the process goes on (a lost device is
//     recreated before the next call).
//
// Check is not safe for concurrent use on one device; ctx bounds the
// whole check.
type Gate interface {
	Check(ctx context.Context, v *Artifact, seed uint64) (GateReport, error)
}

// GateReport says what the gate ran.
type GateReport struct {
	Seed   uint64
	Shapes []GateShape
}

// GateShape is one shape the gate ran, with the worst error it saw.
type GateShape struct {
	Dims      []int
	MaxError  float64 // the largest error, in the op's own measure
	Tolerance float64 // the op's limit for it
}

// Bench times a candidate against a baseline on this device.
//
// An implementation must: run the gate's checks on fresh inputs (from
// opt.Seed) different from the ones the gate used, so a kernel that
// recognises its inputs gains nothing; warm up; time opt.Runs batched
// dispatches of each, interleaved in both orders (candidate then baseline,
// then baseline then candidate) so drift falls on both; check the
// candidate's output after the timed runs against the reference, failing
// with ErrGate, so a kernel right only when it is not timed is caught;
// and measure the device's copy bandwidth in the same run, to fill
// FloorNs with the time the op's bytes need at that bandwidth.
//
// Compare is not safe for concurrent use on one device; ctx bounds it.
type Bench interface {
	Compare(ctx context.Context, candidate, baseline *Artifact, dims []int, opt BenchOptions) (BenchResult, error)
}

// BenchOptions are the knobs of a comparison.
type BenchOptions struct {
	Warmup int    // dispatches before timing; 0 means 10
	Runs   int    // timed dispatches of each variant; 0 means 50
	Seed   uint64 // of the inputs
}

// BenchResult is a comparison's raw measurements: run i of the candidate
// and run i of the baseline were timed next to each other.
type BenchResult struct {
	Op          string
	Dims        []int
	Seed        uint64
	CandidateNs []int64 // per dispatch
	BaselineNs  []int64
	FloorNs     int64 // the op's bytes at the copy bandwidth measured in the same run
}

// Speedup is the summary of a comparison: the ratio of the medians
// (baseline / candidate) and its bootstrap 95% interval.
type Speedup struct {
	CandidateNs, BaselineNs int64 // medians
	Median, Low, High       float64
}

// Bounds of a comparison's sample.
const (
	MinRuns        = 5
	MaxRuns        = 1000
	bootstrapIters = 2000
)

// Summarize computes r's speedup and its interval by a paired bootstrap
// (runs resampled with their neighbours, so drift stays paired), with
// the random stream seeded by r.Seed so the summary is reproducible. It
// refuses a sample that is too small, unequal, not positive, or whose
// candidate median is below the roofline floor (ErrTooFast).
func Summarize(r BenchResult) (Speedup, error) {
	n := len(r.CandidateNs)
	if n < MinRuns || n > MaxRuns || len(r.BaselineNs) != n {
		return Speedup{}, fmt.Errorf("kernels: %d candidate and %d baseline runs (want equal, %d..%d)", n, len(r.BaselineNs), MinRuns, MaxRuns)
	}
	for i := range n {
		if r.CandidateNs[i] <= 0 || r.BaselineNs[i] <= 0 || r.CandidateNs[i] > maxSafeInt || r.BaselineNs[i] > maxSafeInt {
			return Speedup{}, fmt.Errorf("kernels: run %d timed %d and %d ns", i, r.CandidateNs[i], r.BaselineNs[i])
		}
	}
	s := Speedup{CandidateNs: median(r.CandidateNs), BaselineNs: median(r.BaselineNs)}
	if r.FloorNs <= 0 {
		return Speedup{}, fmt.Errorf("kernels: no roofline floor measured")
	}
	if s.CandidateNs < r.FloorNs {
		return Speedup{}, fmt.Errorf("%w: %s median %d ns; its bytes need at least %d ns", ErrTooFast, r.Op, s.CandidateNs, r.FloorNs)
	}
	s.Median = float64(s.BaselineNs) / float64(s.CandidateNs)
	rng := rand.New(rand.NewPCG(r.Seed, 0x626f6f74)) // "boot"
	ratios := make([]float64, bootstrapIters)
	a, b := make([]int64, n), make([]int64, n)
	for it := range ratios {
		for i := range n {
			j := rng.IntN(n)
			a[i], b[i] = r.CandidateNs[j], r.BaselineNs[j]
		}
		ratios[it] = float64(median(b)) / float64(median(a))
	}
	slices.Sort(ratios)
	s.Low, s.High = ratios[bootstrapIters*25/1000], ratios[bootstrapIters*975/1000-1]
	s.Low, s.High = min(s.Low, s.Median), max(s.High, s.Median)
	return s, nil
}

// median of xs (the lower middle for an even count; xs is not changed).
func median(xs []int64) int64 {
	c := slices.Clone(xs)
	slices.Sort(c)
	return c[(len(c)-1)/2]
}

// Claim is what an endorser states besides the measurements.
type Claim struct {
	Kernel, Baseline cas.CID
	ABI              int
	Class            DeviceClass
	Peer             peer.ID
	Tool             string
	Issued           time.Time
	Lifetime         time.Duration // 0 means 30 days
	Nonce            uint64        // below 2^53, never reused by the peer
}

// ErrNotEndorsable is returned by NewEndorsement when the measurements do
// not meet the rule; the error says by how much.
var ErrNotEndorsable = errors.New("kernels: not faster by the endorsing rule")

// NewEndorsement makes the endorsement of a comparison that passed the
// gate, or says why not: the speedup must be at least MinSpeedup and the
// interval's low end above 1. Sign signs it.
func NewEndorsement(r BenchResult, c Claim) (Endorsement, error) {
	s, err := Summarize(r)
	if err != nil {
		return Endorsement{}, err
	}
	shape, err := Bucket(r.Op, r.Dims...)
	if err != nil {
		return Endorsement{}, err
	}
	life := c.Lifetime
	if life == 0 {
		life = 30 * 24 * time.Hour
	}
	e := Endorsement{Version: Version, Kernel: c.Kernel, Op: r.Op, ABI: c.ABI, Class: c.Class.Exact(), Coarse: c.Class.Coarse(),
		Shape: shape, Baseline: c.Baseline, CandidateNs: s.CandidateNs, BaselineNs: s.BaselineNs,
		Speedup: s.Median, SpeedupLow: s.Low, SpeedupHigh: s.High, Seed: r.Seed, Tool: c.Tool, Peer: c.Peer.String(),
		Issued: c.Issued.Unix(), Expires: c.Issued.Add(life).Unix(), Nonce: c.Nonce}
	if !e.Faster() {
		return Endorsement{}, fmt.Errorf("%w: speedup %.3f, 95%% interval [%.3f, %.3f] (want >= %.1f with the low end > 1)",
			ErrNotEndorsable, s.Median, s.Low, s.High, MinSpeedup)
	}
	return e, e.check()
}
