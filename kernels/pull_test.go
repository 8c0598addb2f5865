package kernels

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

// timings makes n paired runs around the given medians, with noise.
func timings(seed uint64, n int, cand, base int64) (c, b []int64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for range n {
		c = append(c, cand+int64(r.IntN(int(cand/20)+1)))
		b = append(b, base+int64(r.IntN(int(base/20)+1)))
	}
	return c, b
}

func TestSummarize(t *testing.T) {
	c, b := timings(1, 50, 400_000, 725_000)
	r := BenchResult{Op: "attention_decode", Dims: []int{32, 8, 128, 4096}, Seed: 9, CandidateNs: c, BaselineNs: b, FloorNs: 100_000}
	s, err := Summarize(r)
	if err != nil {
		t.Fatal(err)
	}
	if s.Median < 1.7 || s.Median > 1.9 || s.Low > s.Median || s.High < s.Median || s.Low < 1.6 || s.High > 2 {
		t.Fatalf("%+v", s)
	}
	if again, _ := Summarize(r); again != s {
		t.Fatal("the same sample summarized differently")
	}
	// Equal variants: the interval straddles 1.
	c, b = timings(2, 50, 500_000, 500_000)
	s, _ = Summarize(BenchResult{Op: "rmsnorm", CandidateNs: c, BaselineNs: b, FloorNs: 1})
	if !(s.Low < 1 && s.High > 1) {
		t.Fatalf("equal variants: %+v", s)
	}
	for name, bad := range map[string]BenchResult{
		"too few":        {CandidateNs: c[:4], BaselineNs: b[:4], FloorNs: 1},
		"unequal":        {CandidateNs: c, BaselineNs: b[:10], FloorNs: 1},
		"no floor":       {CandidateNs: c, BaselineNs: b},
		"negative time":  {CandidateNs: append([]int64{-1}, c[1:]...), BaselineNs: b, FloorNs: 1},
		"below the roof": {CandidateNs: c, BaselineNs: b, FloorNs: 600_000},
	} {
		if _, err := Summarize(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Summarize(BenchResult{CandidateNs: c, BaselineNs: b, FloorNs: 600_000}); !errors.Is(err, ErrTooFast) {
		t.Fatalf("below the floor: %v; want ErrTooFast", err)
	}
}

func TestNewEndorsement(t *testing.T) {
	key, id := testKey(t, 1)
	claim := Claim{Kernel: cas.Sum([]byte("variant")), Baseline: cas.Sum([]byte("builtin")), ABI: vectorABI, Class: testClass,
		Peer: id, Tool: "peer/0.2", Issued: t0, Nonce: 1}
	c, b := timings(1, 50, 400_000, 725_000)
	e, err := NewEndorsement(BenchResult{Op: "attention_decode", Dims: []int{32, 8, 128, 3000}, Seed: 5, CandidateNs: c, BaselineNs: b, FloorNs: 1000}, claim)
	if err != nil {
		t.Fatal(err)
	}
	if e.Shape != "32x8x128x4096" || e.Expires != t0.Add(30*24*time.Hour).Unix() || e.Seed != 5 {
		t.Fatalf("%+v", e)
	}
	if err := verifier().Verify(signed(t, e, key)); err != nil {
		t.Fatal(err)
	}
	// 10% faster is measurable but below the rule.
	c, b = timings(3, 50, 500_000, 550_000)
	if _, err := NewEndorsement(BenchResult{Op: "attention_decode", Dims: []int{32, 8, 128, 3000}, CandidateNs: c, BaselineNs: b, FloorNs: 1000}, claim); !errors.Is(err, ErrNotEndorsable) {
		t.Fatalf("1.1x: %v; want ErrNotEndorsable", err)
	}
}

// fakeGate passes every variant except the wrong ones.
type fakeGate struct {
	wrong map[cas.CID]bool
	calls int
}

func (g *fakeGate) Check(_ context.Context, v *Artifact, seed uint64) (GateReport, error) {
	g.calls++
	if g.wrong[v.CID] {
		return GateReport{}, ErrGate
	}
	return GateReport{Seed: seed}, nil
}

// fakeBench times each variant at its entry in ns (by CID).
type fakeBench struct {
	ns    map[cas.CID]int64
	floor int64
	calls int
}

func (b *fakeBench) Compare(_ context.Context, cand, base *Artifact, dims []int, opt BenchOptions) (BenchResult, error) {
	b.calls++
	c, bs := timings(opt.Seed, 20, b.ns[cand.CID], b.ns[base.CID])
	return BenchResult{Op: cand.Descriptor.Op, Dims: dims, Seed: opt.Seed, CandidateNs: c, BaselineNs: bs, FloorNs: b.floor}, nil
}

// A wrong-but-fast variant endorsed by ten peers is never activated; an
// honest faster one endorsed by two is, and rolls back; one slower here
// than claimed is not; an endorsement naming another op's descriptor is
// refused before it runs.
func TestPull(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	store, err := cas.Open(t.TempDir(), cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	bs, err := RegisterBuiltins(ctx, store)
	if err != nil {
		t.Fatal(err)
	}
	base := bs["attention_decode"]
	variant := func(note string) *Artifact {
		a, err := NewArtifact(Descriptor{Version: DescriptorVersion, Op: "attention_decode", ABI: vectorABI, Entry: "main",
			Workgroup: base.Descriptor.Workgroup}, append(append([]byte(nil), base.WGSL...), []byte("// "+note+"\n")...))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Put(ctx, store); err != nil {
			t.Fatal(err)
		}
		return a
	}
	wrong, honest, slow := variant("wrong"), variant("honest"), variant("slow")
	otherOp := bs["rmsnorm"]
	reg, err := OpenRegistry(t.TempDir(), at(now))
	if err != nil {
		t.Fatal(err)
	}
	endorse := func(v cas.CID, peers int, speedup float64) {
		for i := range peers {
			key, id := keyN(t, i)
			e := sample(id)
			e.Kernel, e.Baseline, e.Nonce = v, base.CID, uint64(len(reg.Endorsements()))
			e.Speedup, e.SpeedupLow, e.SpeedupHigh = speedup, speedup-0.1, speedup+0.1
			e.CandidateNs = int64(float64(e.BaselineNs) / speedup)
			if _, err := reg.AddEndorsement(signed(t, e, key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	endorse(wrong.CID, 10, 5)
	endorse(otherOp.CID, 3, 4)
	endorse(slow.CID, 2, 3)
	endorse(honest.CID, 2, 2)
	gate := &fakeGate{wrong: map[cas.CID]bool{wrong.CID: true}}
	bench := &fakeBench{ns: map[cas.CID]int64{base.CID: 700_000, wrong.CID: 100_000, slow.CID: 690_000, honest.CID: 350_000}, floor: 50_000}
	p := &Puller{Registry: reg, Store: store, Gate: gate, Bench: bench, Policy: Policy{Quorum: 2}, Class: testClass, Baselines: bs, Now: at(now)}
	res, err := p.Pull(ctx, "attention_decode")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("%d results: %+v", len(res), res)
	}
	want := []struct {
		kernel cas.CID
		err    error
	}{{wrong.CID, ErrGate}, {otherOp.CID, ErrDescriptor}, {slow.CID, ErrNotEndorsable}, {honest.CID, nil}}
	for i, w := range want {
		r := res[i]
		if r.Candidate.Kernel != w.kernel || !errors.Is(r.Err, w.err) || r.Activated != (w.err == nil) {
			t.Errorf("result %d: %s activated=%v err=%v; want %s err %v", i, r.Candidate.Kernel, r.Activated, r.Err, w.kernel, w.err)
		}
	}
	if gate.calls != 3 || bench.calls != 2 {
		t.Fatalf("gate ran %d times, bench %d; want 3 and 2 (the other op's descriptor never runs, the wrong one is never timed)", gate.calls, bench.calls)
	}
	if reg.Active("attention_decode") != honest.CID.String() {
		t.Fatalf("active %s", reg.Active("attention_decode"))
	}
	// Pulling again tries the rest against the new active variant: the
	// wrong one still fails the gate, nothing changes.
	res, _ = p.Pull(ctx, "attention_decode")
	for _, r := range res {
		if r.Activated {
			t.Fatalf("second pull activated %s", r.Candidate.Kernel)
		}
	}
	if prev, err := reg.Rollback("attention_decode"); err != nil || prev != Builtin {
		t.Fatalf("rollback: %s %v", prev, err)
	}
	// Every refusal of the first pull was a verdict (Judged); a Skip that
	// passes over judged variants tries only what it has not judged.
	for _, r := range want[:3] {
		if !Judged(r.err) {
			t.Fatalf("%v is not a verdict", r.err)
		}
	}
	if Judged(context.Canceled) || Judged(errors.New("fetch: no provider")) {
		t.Fatal("a failure to fetch or a cancellation counted as a verdict")
	}
	judged := map[cas.CID]bool{wrong.CID: true, otherOp.CID: true, slow.CID: true}
	p.Skip = func(c Candidate) bool { return judged[c.Kernel] }
	gate.calls, bench.calls = 0, 0
	res, err = p.Pull(ctx, "attention_decode")
	if err != nil || len(res) != 1 || res[0].Candidate.Kernel != honest.CID || !res[0].Activated {
		t.Fatalf("pull with the judged ones skipped: %+v, %v; want the honest one alone", res, err)
	}
	if gate.calls != 1 {
		t.Fatalf("gate ran %d times; want 1", gate.calls)
	}
}
