package p2p

import (
	"bytes"
	"context"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

// overlayMember is a swarm member with an overlay and a store.
type overlayMember struct {
	st *cas.Store
	ov *Overlay
	m  *swarm.Member
}

func startOverlayMember(t *testing.T, url string, bootstrap []string) *overlayMember {
	t.Helper()
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	id, _ := swarm.NewIdentity()
	ov, err := NewOverlay(ctxFor(t, 20*time.Second), OverlayConfig{Identity: id, Loopback: true, Bootstrap: bootstrap})
	if err != nil {
		t.Fatal(err)
	}
	m, err := swarm.Start(ctxFor(t, 20*time.Second), swarm.StartOptions{
		Config:    swarm.Config{Identity: id, Source: st, Loopback: true},
		SignalURL: url,
		Topics:    []string{"overlay-test"},
		Overlay:   ov,
		Persist:   url == "",
		Announce: func(context.Context) ([]cas.CID, error) {
			var out []cas.CID
			err := st.List(func(i cas.Info) error {
				out = append(out, i.CID)
				return nil
			})
			return out, err
		},
		AnnounceEvery: 200 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		ov.Close()
		st.Close()
	})
	return &overlayMember{st: st, ov: ov, m: m}
}

func waitUntil(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Peers that met through a signaling server keep finding each other's
// blobs (DHT) and opening new connections (signaling over libp2p) after
// the server is gone; a peer that joins later through a bootstrap
// address, with no server at all, fetches too.
func TestMembersOutliveSignaling(t *testing.T) {
	srv := signaling.NewServer(signaling.Config{})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + signaling.Path

	seed := startOverlayMember(t, url, nil)
	data := make([]byte, 3<<20+12345)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	info, err := seed.st.Put(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	a := startOverlayMember(t, url, nil)
	b := startOverlayMember(t, url, nil)
	// Meeting: each signed-in member opened a link to the others, whose
	// offers and answers carried overlay addresses.
	waitUntil(t, "overlay connections", 20*time.Second, func() bool {
		return len(seed.ov.Peers()) >= 2 && len(a.ov.Peers()) >= 2 && len(b.ov.Peers()) >= 2
	})
	waitUntil(t, "the seeder's provider record", 20*time.Second, func() bool { return seed.m.Announced() >= 1 })

	srv.Close() // the signaling server is gone
	waitUntil(t, "the members to notice", 10*time.Second, func() bool { return !a.m.Online() && !b.m.Online() })
	sentBefore := a.ov.Signal.Stats().Sent
	dialedBefore := a.m.Node().Stats().LinksDialed

	ctx := ctxFor(t, 60*time.Second)
	if _, err := a.m.Node().Fetch(ctx, a.st, info.CID, swarm.FetchOptions{Discover: a.m.Discover, Providers: a.m.Providers}); err != nil {
		t.Fatalf("fetch without the signaling server: %v", err)
	}
	if got := a.m.Node().Stats().LinksDialed - dialedBefore; got < 1 {
		t.Errorf("%d links dialed after the server stopped; want >= 1", got)
	}
	if got := a.ov.Signal.Stats().Sent - sentBefore; got < 1 {
		t.Errorf("%d signaling messages over libp2p after the server stopped; want >= 1", got)
	}

	// A newcomer with no server at all, bootstrapping through b (which
	// does not hold the blob): the DHT names the holders.
	late := startOverlayMember(t, "", b.ov.P2PAddrs())
	waitUntil(t, "a's provider record", 20*time.Second, func() bool { return a.m.Announced() >= 1 })
	provs, err := late.m.Providers(ctx, info.CID)
	if err != nil || len(provs) == 0 {
		t.Fatalf("providers of %s: %v %v", info.CID, provs, err)
	}
	if _, err := late.m.Node().Fetch(ctx, late.st, info.CID, swarm.FetchOptions{Discover: late.m.Discover, Providers: late.m.Providers}); err != nil {
		t.Fatalf("newcomer's fetch: %v", err)
	}
	for _, x := range []*overlayMember{a, late} {
		fr, err := x.st.OpenFile(info.CID)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, fr.Size())
		fr.ReadAt(got, 0)
		if !bytes.Equal(got, data) {
			t.Fatal("fetched bytes differ")
		}
	}
}

// A member with an overlay that met another, announced and was closed
// (member, then overlay) leaves no goroutine behind.
func TestOverlayMemberCloseStopsGoroutines(t *testing.T) {
	srv := signaling.NewServer(signaling.Config{})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + signaling.Path
	round := func() {
		var ms []*swarm.Member
		var ovs []*Overlay
		for range 2 {
			id, _ := swarm.NewIdentity()
			ov, err := NewOverlay(ctxFor(t, 10*time.Second), OverlayConfig{Identity: id, Loopback: true})
			if err != nil {
				t.Fatal(err)
			}
			m, err := swarm.Start(ctxFor(t, 10*time.Second), swarm.StartOptions{
				Config: swarm.Config{Identity: id, Loopback: true}, SignalURL: url, Topics: []string{"leak"}, Overlay: ov,
				Announce:      func(context.Context) ([]cas.CID, error) { return []cas.CID{cas.Sum([]byte("x"))}, nil },
				AnnounceEvery: 50 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			ms, ovs = append(ms, m), append(ovs, ov)
		}
		waitUntil(t, "a provider record", 10*time.Second, func() bool { return ms[0].Announced()+ms[1].Announced() >= 1 })
		for i := range ms {
			ms[i].Close()
			ovs[i].Close()
		}
	}
	round() // warm-up: package-level goroutines start here
	base := runtime.NumGoroutine()
	for range 2 {
		round()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after 2 rounds; %d before\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}
