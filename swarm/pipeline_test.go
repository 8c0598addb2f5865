package swarm

import (
	"testing"
	"time"
)

// A peer's pieces in flight follow its measured bandwidth x round trip:
// pieces of 1 MiB answered at a steady rate, each first byte after a
// round trip, on a fake clock.
func TestPipelineFollowsBandwidthTimesRTT(t *testing.T) {
	const piece = 1 << 20
	cases := []struct {
		name string
		rate float64       // pieces a second the peer delivers
		rtt  time.Duration // time to first byte of each
		most int
		want int
	}{
		// 100 MiB/s x 1 ms = 0.1 pieces: one, and one in transfer.
		{"fast and near", 100, time.Millisecond, 64, 2},
		// 100 MiB/s x 100 ms = 10 pieces.
		{"fast and far", 100, 100 * time.Millisecond, 64, 11},
		// 20 MiB/s x 200 ms = 4 pieces.
		{"slower and farther", 20, 200 * time.Millisecond, 64, 5},
		// 2 MiB/s x 50 ms = 0.1: the floor.
		{"slow", 2, 50 * time.Millisecond, 64, minPipeline},
		// The budget's share caps it.
		{"capped", 100, time.Second, 8, 8},
		// Never below the floor, even with a smaller cap.
		{"cap below the floor", 100, time.Second, 1, minPipeline},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var e pathEstimate
			now := time.Unix(1e9, 0)
			if got := e.pipeline(now, piece, tc.most); got != minPipeline {
				t.Fatalf("before any answer: %d pieces; want %d", got, minPipeline)
			}
			step := time.Duration(float64(time.Second) / tc.rate)
			// Two seconds of answers, some of them queued behind others
			// (a longer time to first byte): the least one counts.
			for i := 0; i < int(2*tc.rate); i++ {
				now = now.Add(step)
				e.delivered(now, piece, tc.rtt+time.Duration(i%3)*tc.rtt)
			}
			if got := e.pipeline(now, piece, tc.most); got != tc.want {
				t.Fatalf("%d pieces in flight (bandwidth %.0f B/s, round trip %v); want %d", got, e.bandwidth(now), e.roundTrip(now), tc.want)
			}
		})
	}
}

// What a peer delivered long ago does not count: a peer that stopped
// answering gets the floor again, and round trips older than rttWindow
// are forgotten (a path that got faster is believed within rttWindow).
func TestPipelineForgets(t *testing.T) {
	const piece = 1 << 20
	var e pathEstimate
	now := time.Unix(1e9, 0)
	for range 100 {
		now = now.Add(10 * time.Millisecond)
		e.delivered(now, piece, 100*time.Millisecond)
	}
	if got := e.pipeline(now, piece, 64); got != 11 {
		t.Fatalf("%d pieces; want 11 (100 MiB/s x 100 ms + 1)", got)
	}
	now = now.Add(pipeWindow)
	if got := e.pipeline(now, piece, 64); got != minPipeline {
		t.Fatalf("a second without answers: %d pieces; want %d", got, minPipeline)
	}
	// The path gets faster: 10 ms round trips from now on.
	for range 2 * int(rttWindow/(10*time.Millisecond)) {
		now = now.Add(10 * time.Millisecond)
		e.delivered(now, piece, 10*time.Millisecond)
	}
	if got := e.roundTrip(now); got != 10*time.Millisecond {
		t.Fatalf("round trip %v after %v of 10 ms answers; want 10ms", got, 2*rttWindow)
	}
	if got := e.pipeline(now, piece, 64); got != 2 {
		t.Fatalf("%d pieces; want 2 (100 MiB/s x 10 ms + 1)", got)
	}
	now = now.Add(rttWindow)
	if got := e.roundTrip(now); got != 0 {
		t.Fatalf("round trip %v after %v without answers; want none", got, rttWindow)
	}
}

// The scheduler bounds each peer's pipeline by what the node's fetch
// budget lets one peer hold.
func TestPipelineWithinFetchBudget(t *testing.T) {
	now := time.Unix(1e9, 0)
	cfg, err := Config{Identity: &Identity{}, FetchBudget: 32 << 20, MaxFetchRequests: 256, Now: func() time.Time { return now }}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{cfg: cfg, fetching: newFetchBudget(cfg.FetchBudget, cfg.MaxFetchRequests)}
	s := newScheduler(&fetcher{n: n}, 1<<20, 8)
	// 8 MiB a peer: 7 slices of a 1 MiB piece (each a little over 1 MiB).
	if s.mostInFlight != 7 {
		t.Fatalf("at most %d pieces in flight per peer; want 7", s.mostInFlight)
	}
	for range 100 {
		now = now.Add(10 * time.Millisecond)
		s.delivered("p", 1<<20, time.Second)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got := s.pipeline("p"); got != 7 {
		t.Fatalf("%d pieces in flight; want the budget's 7", got)
	}
}
