package swarm

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/signaling"
)

// sendAbandonedOffer sends to, from n, a validly signed offer for a peer
// connection that n closes at once: the answerer waits for candidates
// that never come.
func sendAbandonedOffer(t *testing.T, n *testNode, to peer.ID, sid string) {
	t.Helper()
	pc, err := n.tr.small.NewPeerConnection(n.tr.conf)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	ordered := true
	if _, err := pc.CreateDataChannel(ctlLabel, &webrtc.DataChannelInit{Ordered: &ordered}); err != nil {
		t.Fatal(err)
	}
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		t.Fatal(err)
	}
	data, err := n.signDescription("offer", sid, to, offer.SDP, linkCaps{Bulk: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.sig.Send(ctx, &signaling.Message{Type: signaling.TypeOffer, To: to.String(), SID: sid, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// countSetups returns the setups in progress at n from p, and the offers
// from p that n refused.
func countSetups(n *Node, p peer.ID) (held, refused int) {
	n.mu.Lock()
	for k := range n.setups {
		if k.peer == p {
			held++
		}
	}
	n.mu.Unlock()
	for _, e := range n.Events() {
		if e.Peer == p && e.Kind == EventRefused {
			refused++
		}
	}
	return held, refused
}

// One identity's abandoned offers hold at most its share of the setup
// slots, and only for SetupProgress: an honest peer still connects.
func TestAbandonedOffersDoNotLockOut(t *testing.T) {
	const offers = 30
	url := startSignal(t)
	seeder := newTestNode(t, url, func(c *Config) {
		c.MaxSetups = 8
		c.SetupProgress = 2 * time.Second
	})
	abuser := newTestNode(t, url, nil)
	for i := range offers {
		sendAbandonedOffer(t, abuser, seeder.ID(), fmt.Sprintf("abandoned-%d", i))
	}
	// Wait until the seeder has taken every offer (held or refused).
	for i := 0; ; i++ {
		held, refused := countSetups(seeder.Node, abuser.ID())
		if held+refused >= offers {
			if held > seeder.cfg.MaxSetupsPerPeer {
				t.Fatalf("abuser holds %d setups; per-peer limit %d", held, seeder.cfg.MaxSetupsPerPeer)
			}
			break
		}
		if i == 1000 {
			t.Fatalf("seeder took %d+%d of %d offers", held, refused, offers)
		}
		time.Sleep(10 * time.Millisecond)
	}
	honest := newTestNode(t, url, func(c *Config) { c.Links = 2 })
	if err := honest.Connect(ctxFor(t, 20*time.Second), seeder.ID()); err != nil {
		t.Fatalf("honest peer beside abandoned offers: %v", err)
	}
	// The abandoned setups go after SetupProgress, well before
	// ConnectTimeout (20s).
	for i := 0; ; i++ {
		held, _ := countSetups(seeder.Node, abuser.ID())
		if held == 0 {
			break
		}
		if i == 1000 {
			t.Fatalf("abuser still holds %d setups after 10s", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
