package swarm

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

func TestPrioGate(t *testing.T) {
	g := newPrioGate()
	ctx := context.Background()
	waiter := func(p Priority) chan struct{} {
		in := make(chan struct{})
		go func() {
			if g.enter(ctx, p) == nil {
				close(in)
			}
		}()
		return in
	}
	blocked := func(in chan struct{}, what string) {
		t.Helper()
		select {
		case <-in:
			t.Fatalf("%s entered", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := g.enter(ctx, PriorityPrefetch); err != nil {
		t.Fatal(err)
	}
	bg := waiter(PriorityBackground)
	blocked(bg, "background, while prefetch is in flight,")
	g.leave(PriorityPrefetch)
	<-bg
	// Higher priorities never wait for lower ones.
	if err := g.enter(ctx, PriorityDemand); err != nil {
		t.Fatal(err)
	}
	pre := waiter(PriorityPrefetch)
	blocked(pre, "prefetch, while demand is in flight,")
	g.leave(PriorityDemand)
	<-pre
	g.leave(PriorityPrefetch)
	g.leave(PriorityBackground)
	g.enter(ctx, PriorityDemand)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.enter(cctx, PriorityBackground); err == nil {
		t.Fatal("background entered while demand is in flight")
	}
	g.leave(PriorityDemand)
	// A request admitted before a higher one entered is not confirmed.
	if err := g.enter(ctx, PriorityBackground); err != nil {
		t.Fatal(err)
	}
	called := false
	if !g.confirm(PriorityBackground, func() { called = true }) || !called {
		t.Fatal("background not confirmed with nothing above it")
	}
	g.enter(ctx, PriorityPrefetch)
	called = false
	if g.confirm(PriorityBackground, func() { called = true }) || called {
		t.Fatal("background confirmed while prefetch is in flight")
	}
	if !g.confirm(PriorityPrefetch, nil) {
		t.Fatal("prefetch not confirmed above background")
	}
	if Priority(9).clamp() != PriorityBackground || Priority(-1).clamp() != PriorityBackground {
		t.Fatal("unknown priorities are not background")
	}
}

// A demand fetch started while a background fetch runs from the same slow
// seeder: no background request is sent while a demand request is in
// flight, and the demand fetch finishes first.
func TestDemandOvertakesBackground(t *testing.T) {
	url := startSignal(t)
	seed := newTestNode(t, url, func(c *Config) { c.ServeRate = 8 << 20 })
	// One request at a time per fetch, so that the background fetch has
	// requests still to send when the demand begins.
	n := newTestNode(t, url, func(c *Config) { c.Links, c.Window = 1, 1 })
	big := put(t, seed.st, randBytes(51, 12<<20))
	small := put(t, seed.st, randBytes(52, 2<<20+7))
	var overlapped, violations atomic.Int64
	var demandStarted atomic.Bool
	hooks := &fetchHooks{requested: func(_ peer.ID, c cas.CID, _, _ int64) {
		if c != big.CID {
			demandStarted.Store(true)
			return
		}
		if demandStarted.Load() {
			overlapped.Add(1)
		}
		if n.prio.inFlight(PriorityDemand) > 0 {
			violations.Add(1)
		}
	}}
	var wg sync.WaitGroup
	var bgErr error
	var bgDone, demandDone time.Time
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, bgErr = n.Fetch(ctxFor(t, time.Minute), n.st, big.CID, FetchOptions{Peers: []peer.ID{seed.ID()}, Priority: PriorityBackground, hooks: hooks})
		bgDone = time.Now()
	}()
	time.Sleep(300 * time.Millisecond)
	if _, err := n.Fetch(ctxFor(t, time.Minute), n.st, small.CID, FetchOptions{Peers: []peer.ID{seed.ID()}, hooks: hooks}); err != nil {
		t.Fatal(err)
	}
	demandDone = time.Now()
	wg.Wait()
	if bgErr != nil {
		t.Fatal(bgErr)
	}
	if overlapped.Load() == 0 {
		t.Fatal("the background fetch sent nothing after the demand began: the test shows nothing")
	}
	if v := violations.Load(); v > 0 {
		t.Fatalf("%d background requests sent while a demand request was in flight", v)
	}
	if !demandDone.Before(bgDone) {
		t.Fatalf("demand finished %v after background", demandDone.Sub(bgDone))
	}
}
