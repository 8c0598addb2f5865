package p2p

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rdrr/peer/cas"
)

type testDHT struct {
	*DHT
	h   *Host
	reg *prometheus.Registry
}

// newTestDHTs starts n loopback hosts with DHTs in server mode; all but
// the first bootstrap from the first (configured by multiaddr), and each
// waits until its routing table is not empty.
func newTestDHTs(t *testing.T, n int, mod func(*DHTConfig)) []*testDHT {
	t.Helper()
	out := make([]*testDHT, n)
	var boot []string
	for i := range n {
		h := newTestHost(t)
		reg := prometheus.NewRegistry()
		cfg := DHTConfig{Mode: DHTServer, Bootstrap: boot, Registerer: reg}
		if mod != nil {
			mod(&cfg)
		}
		d, err := NewDHT(ctxFor(t, 10*time.Second), h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		out[i] = &testDHT{DHT: d, h: h, reg: reg}
		if i == 0 {
			boot = []string{fmt.Sprintf("%s/p2p/%s", h.Addrs()[0], h.ID())}
			continue
		}
		if err := d.Bootstrap(ctxFor(t, 10*time.Second), nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range out {
		waitFor(t, 10*time.Second, fmt.Sprintf("dht %d routing table", i), func() bool { return d.RoutingTableSize() > 0 })
	}
	for _, d := range out {
		if err := d.Refresh(ctxFor(t, 20*time.Second)); err != nil {
			t.Logf("refresh: %v", err)
		}
	}
	return out
}

// newLateDHT starts one more DHT that bootstraps from boot.
func newLateDHT(t *testing.T, boot *testDHT) *DHT {
	t.Helper()
	h := newTestHost(t)
	d, err := NewDHT(ctxFor(t, 10*time.Second), h, DHTConfig{Mode: DHTServer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Bootstrap(ctxFor(t, 10*time.Second), []peer.AddrInfo{boot.h.AddrInfo()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "late dht routing table", func() bool { return d.RoutingTableSize() > 0 })
	return d
}

// holdsRecord reports whether d stores a provider record of c by p.
func holdsRecord(t testing.TB, d *DHT, c cas.CID, p peer.ID) bool {
	gc, err := goCID(c)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.d.ProviderStore().GetProviders(ctxFor(t, 5*time.Second), gc.Hash())
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(ps, func(ai peer.AddrInfo) bool { return ai.ID == p })
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ids(ais []peer.AddrInfo) []peer.ID {
	out := make([]peer.ID, 0, len(ais))
	for _, ai := range ais {
		out = append(out, ai.ID)
	}
	slices.Sort(out)
	return out
}

func TestDHTFindsProviders(t *testing.T) {
	ds := newTestDHTs(t, 8, nil)
	protos := ds[1].h.Mux().Protocols()
	if !slices.Contains(protos, "/rdrr/kad/1.0.0") || slices.Contains(protos, "/ipfs/kad/1.0.0") {
		t.Fatalf("host speaks %v; want /rdrr/kad/1.0.0 and not the public DHT", protos)
	}
	blob := cas.Sum([]byte("a blob served by two peers"))
	for _, i := range []int{3, 6} {
		if err := ds[i].Provide(ctxFor(t, 30*time.Second), blob); err != nil {
			t.Fatal(err)
		}
	}
	want := []peer.ID{ds[3].h.ID(), ds[6].h.ID()}
	slices.Sort(want)
	for _, i := range []int{0, 5, 7} {
		got, err := ds[i].FindProviders(ctxFor(t, 30*time.Second), blob, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(got), want) {
			t.Fatalf("dht %d found providers %v; want %v", i, ids(got), want)
		}
		for _, ai := range got {
			if len(ai.Addrs) == 0 {
				t.Fatalf("provider %s without addresses", ai.ID)
			}
		}
	}
	// A provider does not list itself; the limit holds.
	got, err := ds[3].FindProviders(ctxFor(t, 30*time.Second), blob, 10)
	if err != nil || !slices.Equal(ids(got), []peer.ID{ds[6].h.ID()}) {
		t.Fatalf("provider 3 found %v, %v; want only 6", ids(got), err)
	}
	if got, _ := ds[7].FindProviders(ctxFor(t, 30*time.Second), blob, 1); len(got) != 1 {
		t.Fatalf("limit 1 gave %d providers", len(got))
	}
	// The collection CID of the same bytes finds the same providers.
	got, _ = ds[7].FindProviders(ctxFor(t, 30*time.Second), cas.CollectionCID(blob.Digest()), 10)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("collection CID found %v; want %v", ids(got), want)
	}
	// A peer that joins after the announcements holds no record itself:
	// it finds the providers by asking the others.
	late := newLateDHT(t, ds[0])
	got, err = late.FindProviders(ctxFor(t, 30*time.Second), blob, 10)
	if err != nil || !slices.Equal(ids(got), want) {
		t.Fatalf("late peer found %v, %v; want %v", ids(got), err, want)
	}
	// Nobody provides this one.
	none := cas.Sum([]byte("nobody has this"))
	got, err = ds[7].FindProviders(ctxFor(t, 30*time.Second), none, 10)
	if err != nil || len(got) != 0 {
		t.Fatalf("unprovided blob: %v, %v", ids(got), err)
	}
	if v := testutil.ToFloat64(ds[7].m.lookups.WithLabelValues("found")); v != 3 {
		t.Fatalf("found lookups = %v; want 3", v)
	}
	if v := testutil.ToFloat64(ds[7].m.lookups.WithLabelValues("none")); v != 1 {
		t.Fatalf("empty lookups = %v; want 1", v)
	}
	if v := testutil.ToFloat64(ds[7].m.rtSize); v < 1 {
		t.Fatalf("routing table gauge = %v", v)
	}
	if n, err := testutil.GatherAndCount(ds[7].reg, "rdrr_dht_lookup_seconds"); err != nil || n != 1 {
		t.Fatalf("lookup histogram series = %d, %v; want 1 (find_providers)", n, err)
	}
	// Records are held by others: a provider that left is still found.
	gone := cas.Sum([]byte("a blob whose provider left"))
	if err := ds[2].Provide(ctxFor(t, 30*time.Second), gone); err != nil {
		t.Fatal(err)
	}
	// Provide returns once the records are sent, not stored: wait until
	// the others hold one.
	for i, d := range ds {
		if i != 2 {
			waitFor(t, 10*time.Second, fmt.Sprintf("dht %d holds the record", i), func() bool { return holdsRecord(t, d.DHT, gone, ds[2].h.ID()) })
		}
	}
	ds[2].Close()
	ds[2].h.Close()
	got, err = ds[5].FindProviders(ctxFor(t, 30*time.Second), gone, 1)
	if err != nil || !slices.Equal(ids(got), []peer.ID{ds[2].h.ID()}) {
		t.Fatalf("provider that left: found %v, %v; want %s", ids(got), err, ds[2].h.ID())
	}
}

func TestDHTReprovides(t *testing.T) {
	ds := newTestDHTs(t, 3, func(c *DHTConfig) { c.ReprovideInterval = 100 * time.Millisecond })
	a := cas.Sum([]byte("a")) // raw and collection CIDs of a are one entry
	if err := ds[1].Provide(ctxFor(t, 30*time.Second), a); err != nil {
		t.Fatal(err)
	}
	if err := ds[1].Provide(ctxFor(t, 30*time.Second), cas.CollectionCID(a.Digest())); err != nil {
		t.Fatal(err)
	}
	if n := ds[1].Provided(); n != 1 {
		t.Fatalf("provided %d; want 1", n)
	}
	waitFor(t, 20*time.Second, "re-provide", func() bool {
		return testutil.ToFloat64(ds[1].m.provides.WithLabelValues("ok")) >= 4
	})
	if failed := ds[1].Reprovide(ctxFor(t, 30*time.Second)); failed != 0 {
		t.Fatalf("%d re-provides failed", failed)
	}
	ds[1].Unprovide(a)
	if n := ds[1].Provided(); n != 0 {
		t.Fatalf("provided %d after Unprovide; want 0", n)
	}
}

func TestDHTMaxProvided(t *testing.T) {
	ds := newTestDHTs(t, 2, func(c *DHTConfig) { c.MaxProvided = 1 })
	if err := ds[1].Provide(ctxFor(t, 30*time.Second), cas.Sum([]byte("1"))); err != nil {
		t.Fatal(err)
	}
	if err := ds[1].Provide(ctxFor(t, 30*time.Second), cas.Sum([]byte("2"))); err == nil {
		t.Fatal("provided more than MaxProvided")
	}
}

// A fetch's lookup (FindFirstProviders) finds the live provider when a
// record of a provider that left is held too. (On loopback both records
// come in the same answers, so this checks what the lookup returns, not
// when its grace period starts.)
func TestDHTFindFirstProvidersPastAProviderGone(t *testing.T) {
	ds := newTestDHTs(t, 6, nil)
	blob := cas.Sum([]byte("a blob whose first provider left"))
	for _, i := range []int{2, 4} {
		if err := ds[i].Provide(ctxFor(t, 30*time.Second), blob); err != nil {
			t.Fatal(err)
		}
	}
	for i, d := range ds {
		if i != 2 && i != 4 {
			waitFor(t, 10*time.Second, fmt.Sprintf("dht %d holds both records", i), func() bool {
				return holdsRecord(t, d.DHT, blob, ds[2].h.ID()) && holdsRecord(t, d.DHT, blob, ds[4].h.ID())
			})
		}
	}
	ds[2].Close()
	ds[2].h.Close()
	for _, i := range []int{0, 1, 3, 5} {
		got, err := ds[i].FindFirstProviders(ctxFor(t, 30*time.Second), blob, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ids(got), ds[4].h.ID()) {
			t.Fatalf("dht %d found %v; want the live provider %s among them", i, ids(got), ds[4].h.ID())
		}
	}
}
