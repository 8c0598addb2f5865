package swarm

import (
	"context"
	"sync"
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
	mu      sync.Mutex
	active  [numPriorities]int
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
			blocked = blocked || g.active[q] > 0
		}
		if !blocked {
			g.active[p]++
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
	g.active[p]--
	close(g.changed)
	g.changed = make(chan struct{})
}

// inFlight returns the requests of priority p in flight.
func (g *prioGate) inFlight(p Priority) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.active[p.clamp()]
}
