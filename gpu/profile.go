package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/cogentcore/webgpu/wgpu"
)

// GPU time of dispatches, from timestamp queries.
//
// While a profile runs (StartProfile), every submitted batch encodes each
// dispatch in its own compute pass whose beginning and end write GPU
// timestamps, resolved into a buffer of the batch's submission;
// StopProfile reads them back and sums them per kernel and grid. A pass
// per dispatch is how the runtime already separates dependent dispatches
// (wgpu puts a barrier between them either way), so what the profile sees
// is what a normal step runs, give or take the passes' own cost, which
// the gaps between dispatches show.
//
// Timestamps are taken as nanoseconds: wgpu-native v22 resolves raw ticks
// and exposes no timestamp period, and Vulkan on NVIDIA and lavapipe tick
// in nanoseconds (timestampPeriod 1). TestProfile checks the sum against
// the wall clock.

// maxProfiled bounds the dispatches of one batch that get timestamps
// (two queries each; wgpu's limit is 8192 queries a set), and
// maxProfiledBatches the submissions of one profile whose timestamps wait
// for StopProfile (a query set and a buffer each). Dispatches past either
// run untimed and are counted.
var maxProfiled, maxProfiledBatches = 4096, 8192 // variables for TestProfile

// ErrNoTimestamps is returned by StartProfile when the adapter lacks the
// timestamp-query feature or the device was opened without Options.Profile.
var ErrNoTimestamps = errors.New("gpu: timestamp queries unavailable")

// Profile is where the GPU's time went between StartProfile and
// StopProfile.
type Profile struct {
	Submits    int `json:"submits"`
	Dispatches int `json:"dispatches"` // timed ones
	Untimed    int `json:"untimed"`    // past maxProfiled or maxProfiledBatches
	// Busy sums each dispatch's time, beginning to end of its pass.
	Busy time.Duration `json:"busyNs"`
	// Span sums, per submission, the first dispatch's beginning to the
	// last one's end: Span - Busy is the time between dispatches (barriers,
	// launches) when they do not overlap.
	Span time.Duration `json:"spanNs"`
	// Copies sums the time of the copies submitted on their own (uploads,
	// host copies, read-backs), each timed between two empty timed passes;
	// they are in Kernels too, under their kind ("copy host", ...) with a
	// zero grid.
	Copies time.Duration `json:"copiesNs"`
	// Window is the first timed work's beginning to the last one's end,
	// and Idle the part of it in which the GPU ran none of the timed work
	// (dispatches and copies): the time it waited for the host. IdleBefore
	// splits Idle by what ended each wait (a dispatch, or a copy's kind).
	Window     time.Duration            `json:"windowNs"`
	Idle       time.Duration            `json:"idleNs"`
	IdleBefore map[string]time.Duration `json:"idleBeforeNs,omitempty"`
	// IdleBetween splits Idle by the work before and after each wait, as
	// "before > after" (the work before: the span that reached furthest).
	IdleBetween map[string]time.Duration `json:"idleBetweenNs,omitempty"`
	Kernels     []KernelTime             `json:"kernels"` // most time first
}

// KernelTime is the time of one kernel at one grid.
type KernelTime struct {
	Kernel string        `json:"kernel"`
	Groups [3]uint32     `json:"groups"`
	Count  int           `json:"count"`
	Total  time.Duration `json:"totalNs"`
}

// profiler is the state of a running profile; guarded by Device.mu.
type profiler struct {
	submits bool // time each batch as a whole (StartSubmitProfile)
	pending []profiled
	prof    Profile
	byKey   map[kernelKey]int // index into prof.Kernels
	spans   []timedSpan       // every timed dispatch and copy, up to maxSpans
}

type kernelKey struct {
	kernel string
	groups [3]uint32
	copy   bool // a copy timed between two empty passes
	batch  bool // a whole batch timed between two empty passes (StartSubmitProfile)
}

// timedSpan is one timed dispatch or copy on the GPU's clock.
type timedSpan struct {
	start, end uint64
	kind       string // "dispatch", or the copy's kind
}

// maxSpans bounds the spans a profile keeps for its idle time (24 bytes
// and a string header each); past it Idle covers the first ones only.
const maxSpans = 1 << 20

// profiled is one submitted batch's timestamps, not yet read back.
type profiled struct {
	qs      *wgpu.QuerySet
	times   *Buffer // usageQuery: 2 u64 per dispatch
	kernels []kernelKey
}

// timedCopy, while a profile runs, encodes an empty timed pass before the
// copy that the caller encodes next; its end returns the pass after it and
// the resolve of the two timestamps around the copy, and registers them
// with the profile once the caller has submitted (done). Callers hold d.mu.
type timedCopy struct {
	qs  *wgpu.QuerySet
	key kernelKey
}

func (d *Device) beginTimedCopy(enc *wgpu.CommandEncoder, kind string) *timedCopy {
	return d.beginTimed(enc, kernelKey{kernel: kind, copy: true})
}

// beginTimed is beginTimedCopy for what k names: a copy, or a batch's
// dispatches (StartSubmitProfile).
func (d *Device) beginTimed(enc *wgpu.CommandEncoder, k kernelKey) *timedCopy {
	if d.prof == nil || !d.timestamps || len(d.prof.pending) >= maxProfiledBatches {
		return nil
	}
	qs, err := d.dev.CreateQuerySet(&wgpu.QuerySetDescriptor{Type: wgpu.QueryTypeTimestamp, Count: 4})
	if err != nil {
		return nil
	}
	p := beginTimedPass(d.dev, enc, qs, 0, 1)
	if p == nil {
		qs.Release()
		return nil
	}
	p.End()
	p.Release()
	return &timedCopy{qs: qs, key: k}
}

// end encodes the pass after the copy and resolves the copy's start (the
// first pass's end) and end (the second pass's beginning).
func (t *timedCopy) end(d *Device, enc *wgpu.CommandEncoder) *profiled {
	if t == nil {
		return nil
	}
	p := beginTimedPass(d.dev, enc, t.qs, 2, 3)
	if p == nil {
		t.qs.Release()
		return nil
	}
	p.End()
	p.Release()
	times, err := d.allocLocked(usageQuery, 16)
	if err != nil {
		t.qs.Release()
		return nil
	}
	if err := enc.ResolveQuerySet(t.qs, 1, 2, times.raw, 0); err != nil {
		d.releaseLocked(times)
		t.qs.Release()
		return nil
	}
	return &profiled{qs: t.qs, times: times, kernels: []kernelKey{t.key}}
}

// StartProfile starts timing every dispatch submitted from now on (see
// Profile). The device must have been opened with Options.Profile on an
// adapter with the timestamp-query feature.
func (d *Device) StartProfile() error { return d.startProfile(false) }

// StartSubmitProfile is StartProfile timing each submitted batch as a
// whole (from an empty timed pass before its first command to one after
// its last) instead of each dispatch in a pass of its own: two empty
// passes a submission, so that the GPU's idle time between submissions
// (Profile.Idle, IdleBefore "batch") is what a normal step has, with
// little of the per-dispatch profile's cost to the host. Kernels then
// lists "batch" (Busy is the batches' time, Dispatches their count) and
// the copies.
func (d *Device) StartSubmitProfile() error { return d.startProfile(true) }

func (d *Device) startProfile(submits bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	if !d.timestamps {
		return fmt.Errorf("%w on %s (Options.Profile %v)", ErrNoTimestamps, d.info, d.opts.Profile)
	}
	if d.prof == nil {
		d.prof = &profiler{byKey: map[kernelKey]int{}}
	}
	d.prof.submits = submits
	return nil
}

// StopProfile waits for the work submitted so far, stops timing and
// returns what was measured since StartProfile.
func (d *Device) StopProfile(ctx context.Context) (Profile, error) {
	d.mu.Lock()
	p := d.prof
	d.prof = nil
	d.mu.Unlock()
	if p == nil {
		return Profile{}, fmt.Errorf("gpu: StopProfile without StartProfile")
	}
	var first error
	for _, b := range p.pending {
		if first == nil {
			first = p.add(ctx, d, b)
		}
		d.mu.Lock()
		b.qs.Release()
		d.releaseLocked(b.times)
		d.mu.Unlock()
	}
	if first != nil {
		return Profile{}, first
	}
	sort.SliceStable(p.prof.Kernels, func(i, j int) bool { return p.prof.Kernels[i].Total > p.prof.Kernels[j].Total })
	p.idle()
	return p.prof, nil
}

// idle computes Window, Idle and IdleBefore from the spans: the gaps in
// their union, each charged to the span that ended it.
func (p *profiler) idle() {
	if len(p.spans) == 0 {
		return
	}
	sort.Slice(p.spans, func(i, j int) bool { return p.spans[i].start < p.spans[j].start })
	p.prof.IdleBefore = map[string]time.Duration{}
	p.prof.IdleBetween = map[string]time.Duration{}
	reach, last := p.spans[0].end, p.spans[0].kind
	for _, s := range p.spans[1:] {
		if s.start > reach {
			gap := time.Duration(s.start - reach)
			p.prof.Idle += gap
			p.prof.IdleBefore[s.kind] += gap
			p.prof.IdleBetween[last+" > "+s.kind] += gap
		}
		if s.end > reach {
			reach, last = s.end, s.kind
		}
	}
	p.prof.Window = time.Duration(reach - p.spans[0].start)
}

// add reads one batch's timestamps back into the totals.
func (p *profiler) add(ctx context.Context, d *Device, b profiled) error {
	raw := make([]byte, 16*len(b.kernels))
	if err := d.Read(ctx, b.times, raw); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	var first, last uint64
	for i, k := range b.kernels {
		start, end := binary.LittleEndian.Uint64(raw[16*i:]), binary.LittleEndian.Uint64(raw[16*i+8:])
		if end < start { // a counter that wrapped, or a pass the driver did not time
			continue
		}
		if i == 0 || start < first {
			first = start
		}
		last = max(last, end)
		dt := time.Duration(end - start)
		kind := "dispatch"
		if k.batch {
			p.prof.Busy += dt
			p.prof.Dispatches++
			kind = k.kernel
		} else if k.copy {
			p.prof.Copies += dt
			kind = k.kernel
		} else {
			p.prof.Busy += dt
			p.prof.Dispatches++
		}
		if len(p.spans) < maxSpans {
			p.spans = append(p.spans, timedSpan{start, end, kind})
		}
		j, ok := p.byKey[k]
		if !ok {
			j = len(p.prof.Kernels)
			p.byKey[k] = j
			p.prof.Kernels = append(p.prof.Kernels, KernelTime{Kernel: k.kernel, Groups: k.groups})
		}
		p.prof.Kernels[j].Count++
		p.prof.Kernels[j].Total += dt
	}
	if len(b.kernels) == 1 && b.kernels[0].copy {
		return nil // a copy submitted on its own: no span, no submit counted
	}
	if last > first {
		p.prof.Span += time.Duration(last - first)
	}
	p.prof.Submits++
	return nil
}

// timedEncoder is encodeLocked's state while a profile runs: a query set
// for the batch's dispatches (up to maxProfiled).
type timedEncoder struct {
	qs      *wgpu.QuerySet
	kernels []kernelKey
	untimed int
}

// newTimedEncoder makes the query set for a batch of n dispatches, or
// returns nil when no profile runs. Callers hold d.mu.
func (d *Device) newTimedEncoder(n int) (*timedEncoder, error) {
	if d.prof == nil || n == 0 {
		return nil, nil
	}
	if len(d.prof.pending) >= maxProfiledBatches {
		d.prof.prof.Untimed += n
		return nil, nil
	}
	timed := min(n, maxProfiled)
	qs, err := d.dev.CreateQuerySet(&wgpu.QuerySetDescriptor{Type: wgpu.QueryTypeTimestamp, Count: uint32(2 * timed)})
	if err != nil {
		return nil, fmt.Errorf("%w: timestamp query set: %v", ErrValidation, err)
	}
	return &timedEncoder{qs: qs, kernels: make([]kernelKey, 0, timed), untimed: n - timed}, nil
}

// pass begins the timed pass of the next dispatch, or returns nil when the
// batch has used up its queries (the caller then opens a plain pass).
func (t *timedEncoder) pass(d *Device, enc *wgpu.CommandEncoder, kernel string, groups [3]uint32) *wgpu.ComputePassEncoder {
	if len(t.kernels) == cap(t.kernels) {
		return nil
	}
	i := uint32(len(t.kernels))
	p := beginTimedPass(d.dev, enc, t.qs, 2*i, 2*i+1)
	if p != nil {
		t.kernels = append(t.kernels, kernelKey{kernel: kernel, groups: groups})
	}
	return p
}

// finish resolves the queries into a buffer that StopProfile reads after
// the submission. Callers hold d.mu, after the last pass ended.
// The query set stays the caller's until the submission succeeds.
func (t *timedEncoder) finish(d *Device, enc *wgpu.CommandEncoder) (*profiled, error) {
	if len(t.kernels) == 0 {
		return nil, nil
	}
	times, err := d.allocLocked(usageQuery, uint64(16*len(t.kernels)))
	if err != nil {
		return nil, err
	}
	if err := enc.ResolveQuerySet(t.qs, 0, uint32(2*len(t.kernels)), times.raw, 0); err != nil {
		d.releaseLocked(times)
		return nil, fmt.Errorf("%w: resolve timestamps: %v", ErrValidation, err)
	}
	return &profiled{qs: t.qs, times: times, kernels: t.kernels}, nil
}
