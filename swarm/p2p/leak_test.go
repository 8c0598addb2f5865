package p2p

import (
	"runtime"
	"testing"
	"time"

	"github.com/rdrr/peer/swarm"
)

// TestCloseStopsGoroutines: a host with a DHT, gossip and a signaler,
// connected to another and then closed, leaves no goroutine behind (a few
// libp2p package-level ones start once and are tolerated by a warm-up).
func TestCloseStopsGoroutines(t *testing.T) {
	round := func() {
		var hosts [2]*Host
		var closers []func() error
		for i := range hosts {
			id, _ := swarm.NewIdentity()
			h, err := NewHost(HostConfig{Identity: id, Loopback: true})
			if err != nil {
				t.Fatal(err)
			}
			hosts[i] = h
			d, err := NewDHT(ctxFor(t, 5*time.Second), h, DHTConfig{Mode: DHTServer})
			if err != nil {
				t.Fatal(err)
			}
			g, err := NewGossip(h, GossipConfig{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.JoinHaves("rdrr"); err != nil {
				t.Fatal(err)
			}
			s := NewStreamSignaler(h, SignalConfig{})
			r := NewSignalRouter(s, nil)
			closers = append(closers, r.Close, s.Close, g.Close, d.Close, h.Close)
		}
		if err := hosts[0].Connect(ctxFor(t, 5*time.Second), hosts[1].AddrInfo()); err != nil {
			t.Fatal(err)
		}
		for _, c := range closers {
			c()
		}
	}
	round() // warm-up: package-level goroutines start here
	base := runtime.NumGoroutine()
	for range 3 {
		round()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after 3 rounds; %d before\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}
