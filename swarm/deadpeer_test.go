package swarm

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/signaling"
)

// A peer that left the signaling server, still listed somewhere (a
// topic, a provider record), costs a fetch nothing: the server refuses
// the offer to it (unknown_peer) and the dial fails then, not at
// ConnectTimeout, so the ask round does not wait askGrace for it either
// (Stats.AskRoundsCut stays 0: a fetch that waited askGrace would take
// ~2 s, which a loaded machine's fetch can take too, so that is what
// guards it). Connect is timed against half of ConnectTimeout, which a
// dial that waited for it would pass. The server drops a client when it
// sees its connection close; until then it still queues offers to it,
// so the test waits for the peer to leave a topic first.
func TestDeadPeerFailsFast(t *testing.T) {
	const connectTimeout = 10 * time.Second // the fetcher's
	url := startSignal(t)
	seeder := newTestNode(t, url, nil)
	fetcher := newTestNode(t, url, func(c *Config) { c.ConnectTimeout = connectTimeout })
	gone := newTestNode(t, url, nil)
	dead := gone.ID()
	const topic = "deadpeer"
	if _, err := gone.sig.Join(ctxFor(t, 10*time.Second), topic); err != nil {
		t.Fatal(err)
	}
	gone.Close()
	gone.sig.Close()
	waitFor(t, func() bool {
		ps, err := fetcher.sig.Peers(ctxFor(t, 5*time.Second), topic)
		return err == nil && !slices.Contains(ps, dead)
	})
	data := randBytes(31, 1<<20)
	inf := put(t, seeder.st, data)

	start := time.Now()
	err := fetcher.Connect(ctxFor(t, 20*time.Second), dead)
	if took := time.Since(start); !errors.Is(err, signaling.ErrUnknownPeer) || took > connectTimeout/2 {
		t.Fatalf("connect to a peer gone from the server: %v after %v; want %v well before ConnectTimeout (%v)", err, took.Round(time.Millisecond), signaling.ErrUnknownPeer, connectTimeout)
	}

	start = time.Now()
	got, err := fetcher.Fetch(ctxFor(t, 30*time.Second), fetcher.st, inf.CID, FetchOptions{Peers: []peer.ID{dead, seeder.ID()}})
	if err != nil {
		t.Fatal(err)
	}
	if cut := fetcher.Stats().AskRoundsCut; cut != 0 {
		t.Fatalf("fetch with a dead peer listed: %d ask rounds waited askGrace (%v) for peers still connecting; want none", cut, askGrace)
	}
	if took := time.Since(start); took > connectTimeout/2 {
		t.Fatalf("fetch with a dead peer listed took %v; want well under ConnectTimeout (%v)", took.Round(time.Millisecond), connectTimeout)
	}
	if got.CID != inf.CID || !bytes.Equal(readAll(t, fetcher.st, inf.CID), data) {
		t.Fatalf("fetched %s, other bytes; want %s", got.CID, inf.CID)
	}
}
