package swarm

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/signaling"
)

// A peer that left the signaling server, still listed somewhere (a
// topic, a provider record), costs a fetch nothing: the server refuses
// the offer to it (unknown_peer) and the dial fails then, not at
// ConnectTimeout, so the ask round does not wait askGrace for it either.
func TestDeadPeerFailsFast(t *testing.T) {
	url := startSignal(t)
	seeder := newTestNode(t, url, nil)
	fetcher := newTestNode(t, url, func(c *Config) { c.ConnectTimeout = 10 * time.Second })
	gone := newTestNode(t, url, nil)
	dead := gone.ID()
	gone.Close()
	gone.sig.Close()
	data := randBytes(31, 1<<20)
	inf := put(t, seeder.st, data)

	start := time.Now()
	err := fetcher.Connect(ctxFor(t, 20*time.Second), dead)
	if took := time.Since(start); !errors.Is(err, signaling.ErrUnknownPeer) || took > askGrace {
		t.Fatalf("connect to a peer gone from the server: %v after %v; want %v in well under %v", err, took.Round(time.Millisecond), signaling.ErrUnknownPeer, askGrace)
	}

	start = time.Now()
	got, err := fetcher.Fetch(ctxFor(t, 30*time.Second), fetcher.st, inf.CID, FetchOptions{Peers: []peer.ID{dead, seeder.ID()}})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > askGrace {
		t.Fatalf("fetch with a dead peer listed took %v; want under %v (the ask round's grace for peers still connecting)", took.Round(time.Millisecond), askGrace)
	}
	if got.CID != inf.CID || !bytes.Equal(readAll(t, fetcher.st, inf.CID), data) {
		t.Fatalf("fetched %s, other bytes; want %s", got.CID, inf.CID)
	}
}
