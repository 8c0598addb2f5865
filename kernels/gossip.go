package kernels

import (
	"errors"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Gossip carries endorsements between peers on topics, one per coarse
// device class (Topic). The swarm's gossipsub will implement it;
// LocalNetwork is an in-process one for tests.
type Gossip interface {
	// Publish sends data to the topic's subscribers on other peers. It
	// does not keep data. Safe for concurrent use.
	Publish(topic string, data []byte) error
	// Subscribe calls handle with each message on topic and the peer that
	// delivered it (not necessarily the author: the signature names the
	// author). handle must not keep data.
	Subscribe(topic string, handle func(from peer.ID, data []byte))
}

// Topic is the gossip topic of a coarse device class.
func Topic(coarse string) string { return "/rdrr/kernels/" + coarse }

// Publish sends s on the topic of its coarse class.
func Publish(g Gossip, s *SignedEndorsement) error {
	return g.Publish(Topic(s.Endorsement.Coarse), s.Encode())
}

// LocalNetwork is an in-process gossip network: every peer that joins
// receives what the others publish on the topics it subscribed to,
// synchronously, in the publisher's goroutine. Safe for concurrent use.
type LocalNetwork struct {
	mu   sync.Mutex
	subs map[string][]localSub
}

type localSub struct {
	id     peer.ID
	handle func(peer.ID, []byte)
}

// Join returns the network as seen by peer id.
func (n *LocalNetwork) Join(id peer.ID) Gossip { return &localPeer{n: n, id: id} }

type localPeer struct {
	n  *LocalNetwork
	id peer.ID
}

func (p *localPeer) Publish(topic string, data []byte) error {
	p.n.mu.Lock()
	subs := append([]localSub(nil), p.n.subs[topic]...)
	p.n.mu.Unlock()
	for _, s := range subs {
		if s.id != p.id {
			s.handle(p.id, append([]byte(nil), data...))
		}
	}
	return nil
}

func (p *localPeer) Subscribe(topic string, handle func(peer.ID, []byte)) {
	p.n.mu.Lock()
	defer p.n.mu.Unlock()
	if p.n.subs == nil {
		p.n.subs = map[string][]localSub{}
	}
	p.n.subs[topic] = append(p.n.subs[topic], localSub{p.id, handle})
}

// Receiver verifies endorsements as they arrive and stores the valid ones
// in a Registry; invalid ones are dropped and counted by reason. Safe for
// concurrent use.
type Receiver struct {
	V        *Verifier
	Registry *Registry // nil: verify and count only

	mu    sync.Mutex
	stats ReceiverStats
}

// ReceiverStats counts what a Receiver did with the records it was given.
type ReceiverStats struct {
	Accepted  int            // verified and new
	Duplicate int            // verified, already stored
	Dropped   map[string]int // reason (one of the Err* messages, or "store") -> count
}

// Subscribe subscribes r to its device's topic on g.
func (r *Receiver) Subscribe(g Gossip) { g.Subscribe(Topic(r.V.Class.Coarse()), r.Handle) }

// Handle verifies and stores one record: a Subscribe handler. A record
// the registry already holds is a duplicate (gossip delivers records
// again when their authors republish them), not a replay.
func (r *Receiver) Handle(_ peer.ID, data []byte) {
	s, err := Decode(data)
	if err == nil && r.Registry != nil && r.Registry.Has(s) {
		r.mu.Lock()
		r.stats.Duplicate++
		r.mu.Unlock()
		return
	}
	if err == nil {
		err = r.V.Verify(s)
	}
	added := true
	if err == nil && r.Registry != nil {
		if added, err = r.Registry.AddEndorsement(s); err != nil {
			err = fmt.Errorf("store: %w", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err != nil:
		if r.stats.Dropped == nil {
			r.stats.Dropped = map[string]int{}
		}
		r.stats.Dropped[reason(err)]++
	case !added:
		r.stats.Duplicate++
	default:
		r.stats.Accepted++
	}
}

// Stats returns a copy of the counters.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	st.Dropped = make(map[string]int, len(r.stats.Dropped))
	for k, v := range r.stats.Dropped {
		st.Dropped[k] = v
	}
	return st
}

// reason names the kind of a Decode or Verify error.
func reason(err error) string {
	for _, e := range []error{ErrSchema, ErrSignature, ErrClass, ErrABI, ErrExpired, ErrNotYetValid, ErrNotFaster, ErrReplay} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	if errors.Is(err, ErrInvalid) {
		return ErrInvalid.Error()
	}
	return "store"
}
