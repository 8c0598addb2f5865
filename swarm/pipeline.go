package swarm

import (
	"math"
	"time"
)

// Pipelining: a peer gets as many pieces in flight as its path holds,
// bandwidth x round trip in pieces rounded up, plus pipeHeadroom, the
// piece in transfer; at least minPipeline, at most what the node's fetch budget lets one
// peer hold (fetchbudget.go) and the workers of its links. Pieces not in
// flight stay free for whichever peer gets them first, so a slow peer
// does not hold in its queue pieces that others could serve, and a fast
// peer far away is not starved of requests.
//
// The bandwidth is the bytes the peer delivered to the fetch in the last
// pipeWindow; the round trip the least time a request of the last
// rttWindow took to its first byte (a min filter: waiting in the peer's
// queue only adds to it). Rounding up probes for more bandwidth: while
// the peer could deliver faster, k pieces in flight deliver more than
// k-1 pieces' worth a round trip, and the next estimate grows; once the
// path is full it stays.
const (
	pipeWindow   = time.Second
	rttWindow    = 10 * time.Second
	minPipeline  = 2
	pipeHeadroom = 1
	maxRecent    = 256
)

// pathEstimate is what a fetch measured of one peer's path: its recent
// deliveries and round trips. Not safe for concurrent use (the
// scheduler's mutex guards it); times come from the caller, so tests
// drive it with a fake clock.
type pathEstimate struct {
	done []delivery // within pipeWindow of the last one, at most maxRecent
	// rtt holds the least time to first byte of the current rttWindow
	// half (rtt[0], since rttStart) and of the one before (rtt[1]); 0:
	// none measured.
	rtt      [2]time.Duration
	rttStart time.Time
}

type delivery struct {
	at time.Time
	n  int64
}

// delivered records an answer of n bytes, completed at now, whose first
// byte came ttfb after its request was sent.
func (e *pathEstimate) delivered(now time.Time, n int64, ttfb time.Duration) {
	k := 0
	for k < len(e.done) && (now.Sub(e.done[k].at) >= pipeWindow || len(e.done)-k >= maxRecent) {
		k++
	}
	e.done = append(e.done[:0], e.done[k:]...)
	e.done = append(e.done, delivery{now, n})
	if ttfb <= 0 {
		return
	}
	if half := rttWindow / 2; now.Sub(e.rttStart) >= half {
		if now.Sub(e.rttStart) >= 2*half {
			e.rtt[0] = 0 // no sample for a whole window: start over
		}
		e.rtt[1], e.rtt[0], e.rttStart = e.rtt[0], 0, now
	}
	if e.rtt[0] == 0 || ttfb < e.rtt[0] {
		e.rtt[0] = ttfb
	}
}

// bandwidth returns the bytes a second delivered in the last pipeWindow.
func (e *pathEstimate) bandwidth(now time.Time) float64 {
	var n int64
	for _, d := range e.done {
		if now.Sub(d.at) < pipeWindow {
			n += d.n
		}
	}
	return float64(n) / pipeWindow.Seconds()
}

// roundTrip returns the least time to first byte measured in the last
// rttWindow (0 if none).
func (e *pathEstimate) roundTrip(now time.Time) time.Duration {
	switch age := now.Sub(e.rttStart); {
	case age >= rttWindow:
		return 0
	case age >= rttWindow/2:
		return e.rtt[0] // the half before is older than rttWindow
	}
	r := e.rtt[0]
	if e.rtt[1] > 0 && (r == 0 || e.rtt[1] < r) {
		r = e.rtt[1]
	}
	return r
}

// pipeline returns how many pieces of piece bytes the peer gets in
// flight: bandwidth x round trip rounded up, plus pipeHeadroom, within
// [minPipeline, most] (most >= minPipeline).
func (e *pathEstimate) pipeline(now time.Time, piece int64, most int) int {
	bdp := e.bandwidth(now) * e.roundTrip(now).Seconds() / float64(piece)
	k := int(math.Ceil(bdp-1e-6)) + pipeHeadroom // (a whole number of pieces despite rounding)
	return min(max(k, minPipeline), max(most, minPipeline))
}
