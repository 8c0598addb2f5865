package swarm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// The pacer's reservations: one priority queues behind itself; a higher
// one does not wait for the reservations of lower ones made before it,
// and pushes back those made after it. (Its bounds are loose where a
// loaded machine can only make a wait longer: a broken pacer is off by a
// whole second.)
func TestPacerOrder(t *testing.T) {
	const rate = 1 << 20 // bytes a second: 1 MiB takes 1 s
	p := newPacer(rate)
	ctx := context.Background()
	start := time.Now()
	// The first reservation is now; it pushes every later one back.
	if err := p.wait(ctx, PriorityBackground, rate); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 700*time.Millisecond {
		t.Fatalf("the first wait took %v: nothing was reserved before it", d)
	}
	// The next background MiB is due 1 s after the first; a demand MiB
	// reserved after that is due now, and pushes the next background
	// turn back by its second.
	bg := p.next[PriorityBackground]
	if got := bg.Sub(start); got < time.Second || got > 1700*time.Millisecond {
		t.Fatalf("background's next turn %v after the start; want 1 s", got)
	}
	demand := time.Now()
	if err := p.wait(ctx, PriorityDemand, rate); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(demand); d > 700*time.Millisecond {
		t.Fatalf("a demand request waited %v behind a background reservation", d)
	}
	if got := p.next[PriorityBackground]; !got.Equal(bg.Add(time.Second)) {
		t.Fatalf("the demand bytes pushed background's turn back by %v; want 1 s", got.Sub(bg))
	}
	if got := p.next[PriorityPrefetch].Sub(demand); got < time.Second || got > 1700*time.Millisecond {
		t.Fatalf("prefetch's next turn %v after the demand; want 1 s (the demand's bytes)", got)
	}
	// Within a priority, turns follow each other: a quarter of a MiB of
	// demand after the MiB above waits for it.
	if err := p.wait(ctx, PriorityDemand, rate/4); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(demand); d < time.Second {
		t.Fatalf("the second demand request went %v after the first; want 1 s (the first one's turn)", d)
	}

	// A cancelled wait gives its turn back, in its own queue and in
	// those of lower priorities that it pushed back, and wakes those
	// waiting to reserve. Half a MiB of demand, then three MiB of demand
	// reserved at 0.5 s and cancelled at 0.3 s: a background byte asked
	// for meanwhile, 3.5 s from its turn and so not reserving it yet,
	// goes at 0.5 s (not at 2.5 s, when it would have looked again).
	p = newPacer(rate)
	if err := p.wait(ctx, PriorityDemand, rate/2); err != nil {
		t.Fatal(err)
	}
	before := p.next
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	bgDone := make(chan time.Time, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // after the demand reserved
		p.wait(ctx, PriorityBackground, 1)
		bgDone <- time.Now()
	}()
	if err := p.wait(cctx, PriorityDemand, 3*rate); err == nil {
		t.Fatal("a wait whose context ended before its turn returned nil; want its error")
	}
	given := time.Now()
	select {
	case at := <-bgDone:
		if d := at.Sub(given); d > 1200*time.Millisecond {
			t.Fatalf("the background byte went %v after the turn before it was given back; want about 0.2 s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the background byte did not go within 5 s")
	}
	p.mu.Lock()
	after := p.next
	p.mu.Unlock()
	if !after[PriorityDemand].Equal(before[PriorityDemand]) || !after[PriorityPrefetch].Equal(before[PriorityPrefetch]) {
		t.Fatalf("a cancelled demand wait left the demand and prefetch turns at %v; want them back at %v", after, before)
	}

	// A turn more than paceAhead away is not reserved while it waits: a
	// demand request behind three seconds of demand reservations holds
	// nothing that lower priorities must wait behind.
	p = newPacer(rate)
	if err := p.wait(ctx, PriorityDemand, 3*rate); err != nil {
		t.Fatal(err)
	}
	before = p.next
	cctx, cancel = context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.wait(cctx, PriorityDemand, rate/16) }()
	time.Sleep(100 * time.Millisecond)
	p.mu.Lock()
	held := p.next
	p.mu.Unlock()
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a cancelled wait returned nil")
	}
	if held != before {
		t.Fatalf("a wait 3 s from its turn reserved it: turns %v, before %v", held, before)
	}

	var none *pacer
	if err := none.wait(ctx, PriorityDemand, 1<<40); err != nil {
		t.Fatal(err)
	}
}

// Config.FetchRate caps what a node fetches, and Config.ServeRate what
// a node serves: 3 MiB at 1 MiB/s takes at least 2 s either way (the
// first request goes at once), where without a cap it takes a fraction
// of that on loopback.
func TestRateCaps(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out two rate caps (about 5 s)")
	}
	const rate = 1 << 20
	url := startSignal(t)
	data := randBytes(71, 3<<20)
	for _, tc := range []struct {
		name        string
		seed, leech func(*Config)
	}{
		{"download", nil, func(c *Config) { c.FetchRate = rate }},
		{"upload", func(c *Config) { c.ServeRate = rate }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seed := newTestNode(t, url, tc.seed)
			n := newTestNode(t, url, tc.leech)
			info := put(t, seed.st, data)
			start := time.Now()
			if _, err := n.Fetch(ctxFor(t, time.Minute), n.st, info.CID, FetchOptions{Peers: []peer.ID{seed.ID()}}); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			if !bytes.Equal(readAll(t, n.st, info.CID), data) {
				t.Fatal("the copy differs")
			}
			// Each request reserves its turn before it is sent: the
			// bytes after the first request's wait 2 s at least.
			if took < 1800*time.Millisecond {
				t.Fatalf("3 MiB at a cap of 1 MiB/s took %v; want at least 2 s", took)
			}
			t.Logf("3 MiB in %v", took)
			// The counters: every byte verified once, in answers of at
			// most a piece (1 MiB) each, none bad.
			st := n.Stats()
			if st.FetchedBytes != int64(len(data)) || st.VerifiedSlices < 3 || st.BadSlices != 0 {
				t.Fatalf("stats: %d bytes fetched in %d verified slices, %d bad; want %d bytes in at least 3, none bad", st.FetchedBytes, st.VerifiedSlices, st.BadSlices, len(data))
			}
		})
	}
}
