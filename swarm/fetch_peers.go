package swarm

import (
	"fmt"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// peerScore is what one fetch knows of a peer. Guarded by fetcher.mu.
type peerScore struct {
	asked      bool      // asked in this pass over the candidates
	strikes    int       // failures since its last success
	lastStrike time.Time // requests started before it do not count again
	dropped    bool      // no more requests in this fetch
	why        error     // the last strike
	// refused: blobs it refused though it announced them (broke), at
	// most maxRefused.
	refused map[cas.CID]struct{}
}

// score returns p's score, creating it. f.mu must be held.
func (f *fetcher) score(p peer.ID) *peerScore {
	ps := f.peers[p]
	if ps == nil {
		ps = &peerScore{}
		f.peers[p] = ps
	}
	return ps
}

// strike counts a failure of p: a request started at start (zero: not a
// request) that timed out, came back short or malformed, or was refused
// though p announced the blob. Failures of requests that were in flight
// together count once, so one network hiccup is one strike; MaxStrikes in
// a row drop p from the fetch and its pieces go to other providers. It
// reports whether the failure counted.
func (f *fetcher) strike(p peer.ID, start time.Time, err error) bool {
	f.mu.Lock()
	ps := f.score(p)
	if ps.dropped || !start.IsZero() && start.Before(ps.lastStrike) {
		f.mu.Unlock()
		return false
	}
	ps.strikes++
	ps.lastStrike = time.Now()
	ps.why = err
	strikes := ps.strikes
	drop := strikes >= f.opt.MaxStrikes
	ps.dropped = drop
	s := f.sched
	f.mu.Unlock()
	f.n.log.Debug("swarm: fetch: strike", "peer", p, "strikes", strikes, "err", err)
	if drop {
		f.n.log.Warn("swarm: fetch: dropping peer", "peer", p, "strikes", f.opt.MaxStrikes, "last", err)
		if s != nil {
			s.removePeer(p)
		}
	}
	return true
}

// success clears p's strikes: it answered a request in full.
func (f *fetcher) success(p peer.ID) {
	f.mu.Lock()
	if ps := f.peers[p]; ps != nil {
		ps.strikes = 0
	}
	f.mu.Unlock()
}

// struck reports whether p failed since its last success (it then gets one
// request at a time).
func (f *fetcher) struck(p peer.ID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := f.peers[p]
	return ps != nil && ps.strikes > 0
}

// dropped reports whether p gets no more requests in this fetch.
func (f *fetcher) dropped(p peer.ID) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := f.peers[p]
	return ps != nil && ps.dropped
}

// dropSummary says which peers were dropped and why, for an error message.
func (f *fetcher) dropSummary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	n := 0
	for p, ps := range f.peers {
		if !ps.dropped {
			continue
		}
		if n < 3 {
			if n > 0 {
				b.WriteString("; ")
			}
			fmt.Fprintf(&b, "dropped %s: %v", p, ps.why)
		}
		n++
	}
	switch {
	case n == 0:
		return "no peer was dropped"
	case n > 3:
		fmt.Fprintf(&b, "; and %d more dropped", n-3)
	}
	return b.String()
}
