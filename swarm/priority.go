package swarm

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Priority orders a node's own requests: while requests of a higher
// priority are in flight, those of lower priorities wait before they are
// sent, so a demand page overtakes queued prefetches, and prefetches
// overtake background replication. Requests already sent are not
// recalled (the wire has no priority; a server answers in order).
type Priority int

const (
	// PriorityDemand: someone waits for the bytes now (the zero value).
	PriorityDemand Priority = iota
	// PriorityPrefetch: bytes expected to be needed soon.
	PriorityPrefetch
	// PriorityBackground: replication and other work nobody waits for.
	PriorityBackground
	numPriorities
)

func (p Priority) String() string {
	switch p {
	case PriorityDemand:
		return "demand"
	case PriorityPrefetch:
		return "prefetch"
	case PriorityBackground:
		return "background"
	}
	return "priority(?)"
}

// clamp maps any value to a known priority (unknown: background).
func (p Priority) clamp() Priority {
	if p < PriorityDemand || p >= numPriorities {
		return PriorityBackground
	}
	return p
}

// prioGate counts the node's requests in flight by priority and holds
// lower ones back while higher ones run. Safe for concurrent use.
type prioGate struct {
	mu sync.Mutex
	// active counts requests in flight by priority; changed under mu,
	// read without it by inFlight.
	active  [numPriorities]atomic.Int64
	changed chan struct{} // closed and replaced when a count drops
}

func newPrioGate() *prioGate { return &prioGate{changed: make(chan struct{})} }

// enter waits (within ctx) until no request of a higher priority than p is
// in flight, then counts one of p. Each successful enter needs a leave.
func (g *prioGate) enter(ctx context.Context, p Priority) error {
	p = p.clamp()
	for {
		g.mu.Lock()
		blocked := false
		for q := PriorityDemand; q < p; q++ {
			blocked = blocked || g.active[q].Load() > 0
		}
		if !blocked {
			g.active[p].Add(1)
			g.mu.Unlock()
			return nil
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// leave ends a request of priority p.
func (g *prioGate) leave(p Priority) {
	p = p.clamp()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active[p].Add(-1)
	close(g.changed)
	g.changed = make(chan struct{})
}

// confirm reports whether no request of a higher priority than p is in
// flight, with p already entered; if so it calls then (may be nil) under the
// gate's lock, so that no higher request enters between the check and then.
func (g *prioGate) confirm(p Priority, then func()) bool {
	p = p.clamp()
	g.mu.Lock()
	defer g.mu.Unlock()
	for q := PriorityDemand; q < p; q++ {
		if g.active[q].Load() > 0 {
			return false
		}
	}
	if then != nil {
		then()
	}
	return true
}

// admit waits (within ctx) until a request of priority p for total bytes
// from remote may be sent: it enters the gate, holds the bytes in the
// node's fetch budget, and, since holding them can wait, checks the gate
// again; if a higher request entered meanwhile it lets both go and starts
// over. sent (may be nil) runs once admitted, under the gate's lock. On
// success the caller releases held to the budget and leaves the gate.
func (n *Node) admit(ctx context.Context, p Priority, remote peer.ID, total int64, sent func()) (held int64, err error) {
	for {
		if err := n.prio.enter(ctx, p); err != nil {
			return 0, err
		}
		held, err := n.fetching.acquire(ctx, remote, total)
		if err != nil {
			n.prio.leave(p)
			return 0, err
		}
		if n.prio.confirm(p, sent) {
			return held, nil
		}
		n.fetching.release(remote, held)
		n.prio.leave(p)
	}
}

// inFlight returns the requests of priority p in flight. It takes no lock,
// so it may be called from confirm's then.
func (g *prioGate) inFlight(p Priority) int {
	return int(g.active[p.clamp()].Load())
}
