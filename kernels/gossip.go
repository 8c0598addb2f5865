package kernels

import (
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Gossip carries endorsements between peers on topics (one per coarse
// device class: Topic). The swarm's gossipsub implements it; LocalGossip
// is an in-process one for tests.
type Gossip interface {
	// Publish sends data to the topic's subscribers. Safe for concurrent use.
	Publish(topic string, data []byte) error
	// Subscribe calls handle with each message on topic, from one
	// goroutine. handle must not keep data.
	Subscribe(topic string, handle func(from peer.ID, data []byte))
}

// Topic is the gossip topic of a coarse device class.
func Topic(coarse string) string { return "/rdrr/kernels/" + coarse }

// LocalGossip delivers to every subscriber of a topic in this process.
type LocalGossip struct {
	mu   sync.Mutex
	subs map[string][]func(peer.ID, []byte)
	From peer.ID
}

// Publish delivers data synchronously to the topic's subscribers.
func (g *LocalGossip) Publish(topic string, data []byte) error {
	g.mu.Lock()
	subs := append([]func(peer.ID, []byte){}, g.subs[topic]...)
	g.mu.Unlock()
	for _, h := range subs {
		h(g.From, append([]byte(nil), data...))
	}
	return nil
}

// Subscribe registers handle for topic.
func (g *LocalGossip) Subscribe(topic string, handle func(peer.ID, []byte)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.subs == nil {
		g.subs = map[string][]func(peer.ID, []byte){}
	}
	g.subs[topic] = append(g.subs[topic], handle)
}

// Receiver verifies endorsements as they arrive and stores the valid
// ones; invalid ones are dropped and counted.
type Receiver struct {
	V        *Verifier
	Registry *Registry
	mu       sync.Mutex
	Accepted int
	Dropped  map[string]int // reason -> count
}

// Handle is a Subscribe handler.
func (r *Receiver) Handle(_ peer.ID, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Dropped == nil {
		r.Dropped = map[string]int{}
	}
	s, err := Decode(data)
	if err == nil {
		err = r.V.Verify(s)
	}
	if err == nil && r.Registry != nil {
		err = r.Registry.AddEndorsement(s, r.V.now())
	}
	if err != nil {
		r.Dropped[reason(err)]++
		return
	}
	r.Accepted++
}

func reason(err error) string {
	for _, e := range []error{ErrSignature, ErrExpired, ErrReplay, ErrClass, ErrABI, ErrNotFaster, ErrSchema} {
		if errorsIs(err, e) {
			return e.Error()
		}
	}
	return "other"
}
