package p2p

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
)

// An overlay refuses libp2p connections with the peers its node banned,
// both ways; others connect; and a ban that ends lets the peer in again.
// Have-announcements are sent again on the refresh timer, so a peer that
// subscribes later learns them.
func TestOverlayRefusesBannedPeers(t *testing.T) {
	idA, _ := swarm.NewIdentity()
	idB, _ := swarm.NewIdentity()
	idC, _ := swarm.NewIdentity()
	var banB atomic.Bool
	banB.Store(true)
	a, err := NewOverlay(ctxFor(t, 20*time.Second), OverlayConfig{Identity: idA, Loopback: true,
		RefusePeer: func(p peer.ID) bool { return p == idB.ID && banB.Load() }, HaveRefresh: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := NewOverlay(ctxFor(t, 20*time.Second), OverlayConfig{Identity: idB, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	aInfo := peer.AddrInfo{ID: a.Host.ID(), Addrs: a.Host.Addrs()}
	bInfo := peer.AddrInfo{ID: b.Host.ID(), Addrs: b.Host.Addrs()}
	if err := b.Host.Connect(ctxFor(t, 5*time.Second), aInfo); err == nil {
		// The dial may finish before a's gater closes it: what counts is
		// that no connection stays.
		time.Sleep(200 * time.Millisecond)
	}
	if err := a.Host.Connect(ctxFor(t, 5*time.Second), bInfo); err == nil {
		t.Fatal("a dialled a peer it banned")
	}
	if n := len(a.Host.Network().ConnsToPeer(idB.ID)); n != 0 {
		t.Fatalf("a has %d connections to a banned peer", n)
	}
	if _, byPeer := a.Host.cfg.Gater.(*Gater).Refused(); byPeer == 0 {
		t.Fatal("the gater counted no refusal")
	}
	c, err := NewOverlay(ctxFor(t, 20*time.Second), OverlayConfig{Identity: idC, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Host.Connect(ctxFor(t, 5*time.Second), aInfo); err != nil {
		t.Fatalf("a peer not banned: %v", err)
	}
	banB.Store(false)
	if err := b.Host.Connect(ctxFor(t, 5*time.Second), aInfo); err != nil {
		t.Fatalf("after the ban: %v", err)
	}
	// a provides a blob once (its have-announcement goes out at once, to
	// whoever is subscribed); c learns it from a later refresh at least.
	blob := cas.Sum([]byte("refresh"))
	go a.Provide(ctxFor(t, 10*time.Second), blob)
	waitUntil(t, "c to hear a's have-announcement", 10*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return containsPeer(c.haves[blob.Digest()], a.Host.ID())
	})
	c.mu.Lock()
	delete(c.haves, blob.Digest())
	c.mu.Unlock()
	waitUntil(t, "a's have-announcement again (refresh)", 10*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return containsPeer(c.haves[blob.Digest()], a.Host.ID())
	})
}
