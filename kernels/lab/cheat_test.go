package lab

import (
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/kernels"
)

// cheaters are wrong-but-fast swiglu variants, and where each is caught.
var cheaters = []struct {
	file   string
	byGate bool // the gate catches it; else the benchmark's checks do
	time   bool // it hangs: only an Isolated lab survives it
}{
	{file: "swiglu_nothing.wgsl", byGate: true},          // stale output
	{file: "swiglu_zeros.wgsl", byGate: true},            // writes zeros
	{file: "swiglu_fixed_shapes.wgsl", byGate: true},     // specializes on the shapes it was shown
	{file: "swiglu_oob_write.wgsl", byGate: true},        // writes out of bounds
	{file: "swiglu_oob_read.wgsl", byGate: true},         // reads out of bounds
	{file: "swiglu_bad.wgsl", byGate: true},              // does not compile
	{file: "swiglu_when_poisoned.wgsl", byGate: false},   // right only when not timed
	{file: "swiglu_hang.wgsl", byGate: true, time: true}, // an endless loop
	{file: "swiglu_slow.wgsl", byGate: true, time: true}, // past the time limit
}

// The gate, or the benchmark's checks on fresh inputs after timing, refuse
// every cheater with ErrGate, and the process goes on.
func TestCheatersRejected(t *testing.T) {
	l := &Lab{Dev: testDev}
	base := builtins(t)["swiglu"]
	for _, c := range cheaters {
		if c.time {
			continue // TestIsolatedSurvivesHang
		}
		t.Run(c.file, func(t *testing.T) {
			v := variant(t, "swiglu", "testdata/"+c.file, nil)
			_, err := l.Check(ctxT(t, time.Minute), v, 11)
			if c.byGate {
				if !errors.Is(err, kernels.ErrGate) {
					t.Fatalf("gate: %v; want ErrGate", err)
				}
				t.Logf("gate: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("gate: %v; want a pass (the benchmark catches this one)", err)
			}
			_, err = l.Compare(ctxT(t, time.Minute), v, base, []int{4096}, kernels.BenchOptions{Runs: 5, Seed: 12})
			if !errors.Is(err, kernels.ErrGate) {
				t.Fatalf("compare: %v; want ErrGate", err)
			}
			t.Logf("compare: %v", err)
		})
	}
	if _, err := l.Check(ctxT(t, time.Minute), base, 13); err != nil {
		t.Fatalf("the built-in after the cheaters: %v", err)
	}
}

// A kernel that never finishes is stopped by the worker's time limit on
// each dispatch, or killed with its worker when the whole call runs past
// its limit; either way the caller gets ErrGate and ErrTimeLimit, and the
// next call works.
func TestIsolatedSurvivesHang(t *testing.T) {
	v := variant(t, "swiglu", "testdata/swiglu_slow.wgsl", nil)
	for _, c := range []struct {
		name           string
		call, dispatch time.Duration
		longest        time.Duration
	}{
		{"dispatch limit", time.Minute, time.Second, 40 * time.Second},
		{"call limit", 3 * time.Second, time.Minute, 10 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := isolated()
			w.Timeout, w.DispatchTimeout = c.call, c.dispatch
			start := time.Now()
			_, err := w.Check(ctxT(t, 2*time.Minute), v, 1)
			if !errors.Is(err, kernels.ErrGate) || !errors.Is(err, ErrTimeLimit) {
				t.Fatalf("hang: %v; want ErrGate and ErrTimeLimit", err)
			}
			if el := time.Since(start); el > c.longest {
				t.Fatalf("hang took %v to reject", el)
			}
			t.Logf("%v", err)
		})
	}
	w := isolated()
	if _, err := w.Check(ctxT(t, time.Minute), builtins(t)["swiglu"], 2); err != nil {
		t.Fatalf("built-in after the hang: %v", err)
	}
	// The worker reports the gate's refusals with their sentinel.
	_, err := w.Check(ctxT(t, time.Minute), variant(t, "swiglu", "testdata/swiglu_zeros.wgsl", nil), 3)
	if !errors.Is(err, kernels.ErrGate) || errors.Is(err, ErrTimeLimit) {
		t.Fatalf("zeros in a worker: %v; want ErrGate only", err)
	}
}

// key returns the n-th test identity.
func key(t testing.TB, n byte) (crypto.PrivKey, peer.ID) {
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = n
	k, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, id
}

// endorse signs a valid endorsement of v for class by test identity n.
func endorse(t testing.TB, v, base *kernels.Artifact, class kernels.DeviceClass, n byte, now time.Time) *kernels.SignedEndorsement {
	t.Helper()
	k, id := key(t, n)
	shape, err := kernels.Bucket(v.Descriptor.Op, DefaultShape(v.Descriptor.Op)...)
	if err != nil {
		t.Fatal(err)
	}
	e := kernels.Endorsement{Version: kernels.Version, Kernel: v.CID, Op: v.Descriptor.Op, ABI: kernels.ABIVersion(v.Descriptor.Op),
		Class: class.Exact(), Coarse: class.Coarse(), Shape: shape, Baseline: base.CID, CandidateNs: 1000, BaselineNs: 3000,
		Speedup: 3, SpeedupLow: 2.5, SpeedupHigh: 3.5, Seed: 1, Tool: "test", Peer: id.String(),
		Issued: now.Unix(), Expires: now.Add(time.Hour).Unix(), Nonce: uint64(n)}
	s, err := kernels.Sign(e, k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func openStore(t testing.TB) *cas.Store {
	s, err := cas.Open(t.TempDir(), cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Ten distinct valid endorsements make every cheater a candidate; the
// local gate and benchmark still refuse each, and the built-in stays
// active.
func TestCheatersNeverActivated(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	class := kernels.ClassOf(testDev.Info())
	bs := builtins(t)
	base := bs["swiglu"]
	for _, c := range cheaters {
		t.Run(c.file, func(t *testing.T) {
			st := openStore(t)
			reg, err := kernels.OpenRegistry(t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			v := variant(t, "swiglu", "testdata/"+c.file, nil)
			if err := v.Put(ctx, st); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			recv := &kernels.Receiver{V: &kernels.Verifier{Class: class, ABI: kernels.ABIVersions()}, Registry: reg}
			for n := range byte(10) {
				recv.Handle("", endorse(t, v, base, class, n+1, now).Encode())
			}
			if st := recv.Stats(); st.Accepted != 10 {
				t.Fatalf("receiver: %+v; want 10 accepted", st)
			}
			var gate kernels.Gate = &Lab{Dev: testDev}
			var bench kernels.Bench = &Lab{Dev: testDev}
			if c.time {
				w := isolated()
				w.Timeout = 3 * time.Second
				gate, bench = w, w
			}
			p := &kernels.Puller{Registry: reg, Store: st, Gate: gate, Bench: bench, Class: class, Baselines: bs}
			res, err := p.Pull(ctx, "swiglu")
			if err != nil {
				t.Fatal(err)
			}
			if len(res) != 1 || res[0].Activated || !errors.Is(res[0].Err, kernels.ErrGate) {
				t.Fatalf("pull: %+v; want one candidate refused by the gate", res)
			}
			t.Logf("refused: %v", res[0].Err)
			if got := reg.Active("swiglu"); got != kernels.Builtin {
				t.Fatalf("active swiglu %s; want builtin", got)
			}
		})
	}
}
