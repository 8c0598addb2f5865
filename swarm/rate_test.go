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
// and pushes back those made after it.
func TestPacerOrder(t *testing.T) {
	const rate = 1 << 20 // bytes a second: 1 MiB takes 1 s
	p := newPacer(rate)
	ctx := context.Background()
	start := time.Now()
	// The first reservation is now; it pushes every later one back.
	if err := p.wait(ctx, PriorityBackground, rate); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Fatalf("the first wait took %v: nothing was reserved before it", d)
	}
	// A second background MiB is due at 1 s; a demand MiB reserved
	// after it is due now, and pushes the next background one to 3 s.
	bg := p.next[PriorityBackground]
	if got := bg.Sub(start); got < 900*time.Millisecond || got > 1200*time.Millisecond {
		t.Fatalf("background's next turn %v after the start; want 1 s", got)
	}
	at := time.Now()
	if err := p.wait(ctx, PriorityDemand, rate); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(at); d > 200*time.Millisecond {
		t.Fatalf("a demand request waited %v behind a background reservation", d)
	}
	if got := p.next[PriorityBackground].Sub(bg); got < 900*time.Millisecond || got > 1200*time.Millisecond {
		t.Fatalf("the demand bytes pushed background's turn back by %v; want 1 s", got)
	}
	if got := p.next[PriorityPrefetch].Sub(at); got < 900*time.Millisecond || got > 1200*time.Millisecond {
		t.Fatalf("prefetch's next turn %v after the demand; want 1 s (the demand's bytes)", got)
	}
	// Within a priority, turns follow each other: a quarter of a MiB of
	// demand after the MiB above waits for it.
	at = time.Now()
	if err := p.wait(ctx, PriorityDemand, rate/4); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(at); d < 800*time.Millisecond {
		t.Fatalf("a second demand request waited %v; want about 1 s (the first one's turn)", d)
	}
	// A cancelled wait returns at once with the context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.wait(cctx, PriorityBackground, rate); err == nil {
		t.Fatal("a wait with a cancelled context returned nil; want its error")
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
