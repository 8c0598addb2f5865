package swarm

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// Overlay is a second network between native peers besides the signaling
// server: content routing, and signaling over direct connections, so that
// peers that have met keep finding and reaching each other when the
// server is gone. Package swarm/p2p implements it with libp2p (a host
// with the swarm key, a Kademlia DHT, gossip, signaling streams); this
// package does not import libp2p's network stack. Blob bytes never travel
// over it. Methods are safe for concurrent use.
type Overlay interface {
	// Signaler is the signaler a node uses for the overlay's whole life:
	// it relays over the overlay to peers it can reach that way and
	// through the signaling session of the moment (SetSession) to the
	// others. Its Incoming is closed only when the overlay closes.
	Signaler() Signaler
	// SetSession hands the overlay the signaling session of the moment;
	// nil when it ended.
	SetSession(s Signaler)
	// Meet takes the overlay addresses a peer announced (in an offer or
	// answer whose signature verified) and connects to it in the
	// background, so the peer joins the routing table. It must not block.
	Meet(p peer.ID, addrs []string)
	// Addrs returns the addresses to announce in offers and answers.
	Addrs() []string
	// Peers returns peers the overlay is connected to now (at most a few
	// hundred), candidates for a fetch when no server lists members.
	Peers() []peer.ID
	// Provide announces that this peer serves c (and keeps announcing it
	// until the overlay closes). It blocks until announced or ctx ends.
	Provide(ctx context.Context, c cas.CID) error
	// Providers returns up to limit peers that announced c, made
	// reachable (connected) where the overlay could, within ctx.
	Providers(ctx context.Context, c cas.CID, limit int) ([]peer.ID, error)
}

// haveAnnouncer is an Overlay that can tell its peers at once that this
// peer holds a blob (gossip), before Provide's slower records are made.
// *p2p.Overlay implements it.
type haveAnnouncer interface {
	// AnnounceHave queues c for the next have-announcement. It must not
	// block.
	AnnounceHave(c cas.CID)
}
