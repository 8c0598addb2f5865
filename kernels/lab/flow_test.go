package lab

import (
	"bytes"
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
	"github.com/rdrr/peer/kernels"
)

// storeFetcher fetches blobs from another peer's store (the swarm's job).
type storeFetcher struct{ from, to *cas.Store }

func (f storeFetcher) Fetch(ctx context.Context, c cas.CID, maxSize int64) error {
	info, err := f.from.Stat(c)
	if err != nil {
		return err
	}
	if info.Size > maxSize {
		return errors.New("too large")
	}
	b := make([]byte, info.Size)
	if _, err := f.from.ReadAt(c, b, 0); err != nil {
		return err
	}
	_, err = f.to.Put(ctx, bytes.NewReader(b))
	return err
}

type testPeer struct {
	id    peer.ID
	class kernels.DeviceClass
	store *cas.Store
	reg   *kernels.Registry
	recv  *kernels.Receiver
	net   kernels.Gossip
}

func newPeer(t *testing.T, net *kernels.LocalNetwork, n byte, class kernels.DeviceClass) *testPeer {
	_, id := key(t, n)
	reg, err := kernels.OpenRegistry(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPeer{id: id, class: class, store: openStore(t), reg: reg, net: net.Join(id)}
	p.recv = &kernels.Receiver{V: &kernels.Verifier{Class: class, ABI: kernels.ABIVersions()}, Registry: reg}
	p.recv.Subscribe(p.net)
	return p
}

// Peer A times a variant faster than its active softmax and endorses it;
// B, of the same class, receives the endorsement by gossip, fetches the
// variant from A, gates and times it itself and activates it (and can roll
// back); C, of another class, never sees it and would drop it.
func TestEndorsePullByGossip(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	class := kernels.ClassOf(testDev.Info())
	other := class
	other.Device = "ffff"
	net := &kernels.LocalNetwork{}
	a, b, c := newPeer(t, net, 100, class), newPeer(t, net, 101, class), newPeer(t, net, 102, other)
	bs := builtins(t)
	slow := variant(t, "softmax", "testdata/softmax_slow.wgsl", nil)
	fast := variant(t, "softmax", "variants/softmax_wg.wgsl", nil)
	// A and B run a slow (correct) softmax: the one to beat.
	for _, p := range []*testPeer{a, b, c} {
		if err := slow.Put(ctx, p.store); err != nil {
			t.Fatal(err)
		}
		if err := p.reg.Use("softmax", slow.CID.String()); err != nil {
			t.Fatal(err)
		}
	}
	if err := fast.Put(ctx, a.store); err != nil {
		t.Fatal(err)
	}
	l := &Lab{Dev: testDev}
	keyA, _ := key(t, 100)
	e := &kernels.Endorser{Registry: a.reg, Store: a.store, Gate: l, Bench: l, Class: class, Key: keyA, Tool: "test",
		Baselines: bs, Gossip: a.net}
	dims := []int{32, 4096}
	r, err := e.Endorse(ctx, fast.CID, dims, kernels.BenchOptions{Runs: 15})
	if err != nil {
		t.Fatalf("endorse: %v (speedup %+v)", err, r.Speedup)
	}
	t.Logf("A: speedup %.2f [%.2f, %.2f] over %s", r.Speedup.Median, r.Speedup.Low, r.Speedup.High, r.Baseline.CID)
	if r.Signed == nil || r.Signed.Endorsement.Baseline != slow.CID || r.Signed.Endorsement.Kernel != fast.CID {
		t.Fatalf("endorsement %+v", r.Signed)
	}
	if st := b.recv.Stats(); st.Accepted != 1 {
		t.Fatalf("B received %+v; want 1 accepted", st)
	}
	if st := c.recv.Stats(); st.Accepted+st.Duplicate+len(st.Dropped) != 0 || len(c.reg.Endorsements()) != 0 {
		t.Fatalf("C (another class) received %+v", st)
	}
	// Were it sent to C anyway, C drops it.
	c.recv.Handle(a.id, r.Signed.Encode())
	if st := c.recv.Stats(); st.Dropped[kernels.ErrClass.Error()] != 1 {
		t.Fatalf("C on a direct copy: %+v; want dropped for its class", st)
	}

	pull := func(p *testPeer) []kernels.PullResult {
		pl := &kernels.Puller{Registry: p.reg, Store: p.store, Fetcher: storeFetcher{a.store, p.store}, Gate: l, Bench: l,
			Policy: kernels.Policy{Trusted: map[peer.ID]bool{a.id: true}}, Class: p.class, Baselines: bs}
		res, err := pl.Pull(ctx, "softmax")
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := pull(b)
	if len(res) != 1 || !res[0].Activated {
		t.Fatalf("B pulled %+v; want the variant activated", res)
	}
	t.Logf("B: speedup %.2f [%.2f, %.2f]", res[0].Speedup.Median, res[0].Speedup.Low, res[0].Speedup.High)
	if got := b.reg.Active("softmax"); got != fast.CID.String() {
		t.Fatalf("B's active softmax %s; want %s", got, fast.CID)
	}
	if res := pull(c); len(res) != 0 || c.reg.Active("softmax") != slow.CID.String() {
		t.Fatalf("C pulled %+v (active %s); want nothing", res, c.reg.Active("softmax"))
	}
	if prev, err := b.reg.Rollback("softmax"); err != nil || prev != slow.CID.String() {
		t.Fatalf("rollback: %s, %v; want %s", prev, err, slow.CID)
	}
}

// Activate makes the device's Kernels run the registry's active variant;
// UseOriginal puts the built-in back.
func TestActivate(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	d, err := gpu.Open(ctx, gpu.Options{Backend: testBackend()})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	st := openStore(t)
	reg, err := kernels.OpenRegistry(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dbl := variant(t, "softmax", "testdata/softmax_double.wgsl", nil)
	if err := dbl.Put(ctx, st); err != nil {
		t.Fatal(err)
	}
	if err := reg.Use("softmax", dbl.CID.String()); err != nil {
		t.Fatal(err)
	}
	used, err := Activate(ctx, d, reg, st)
	if err != nil || used["softmax"] != dbl.CID.String() || len(used) != 1 {
		t.Fatalf("activate: %v, %v", used, err)
	}
	if got := d.ActiveVariants()["softmax"]; got == "" {
		t.Fatalf("device variants %v; want softmax", d.ActiveVariants())
	}
	x := normal(seeded(1, "softmax", "activate"), 3*100, 2)
	want := ref.Softmax(ref.F32(x), 3, 100)
	run := func() []float32 {
		k := ops.NewKernels(d)
		defer k.Close()
		xb, _ := d.Alloc(uint64(len(x) * 4))
		yb, _ := d.Alloc(uint64(len(x) * 4))
		defer xb.Release()
		defer yb.Release()
		if err := d.Write(xb, gpu.Bytes(x)); err != nil {
			t.Fatal(err)
		}
		batch := d.Batch()
		if err := k.Softmax(ctx, batch, xb, yb, ops.RowsShape{Rows: 3, Dim: 100}); err != nil {
			t.Fatal(err)
		}
		if err := batch.Submit(ctx); err != nil {
			t.Fatal(err)
		}
		out := make([]byte, len(x)*4)
		if err := d.Read(ctx, yb, out); err != nil {
			t.Fatal(err)
		}
		return f32s(out)
	}
	got := run()
	for i := range want {
		if math.Abs(float64(got[i])-2*want[i]) > 1e-5 {
			t.Fatalf("with the variant: y[%d] = %v; want %v (twice the softmax)", i, got[i], 2*want[i])
		}
	}
	d.UseOriginal("softmax")
	got = run()
	if _, err := worst(got, want, ref.Tolerance(ref.OpSoftmax)); err != nil {
		t.Fatalf("built-in again: %v", err)
	}
}
