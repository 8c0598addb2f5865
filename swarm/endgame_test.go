package swarm

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// A piece whose answer arrived is not copied by endgame while it is being
// written: the copy would claim it too and it would be written twice
// (fetched bytes past the blob; once seen as one piece too many in
// TestLeechersServeEachOther, and as 1 to 2% of a collection in e2e).
// Here the first answer waits, before it is written, well past the
// endgame delay, while the other provider's workers are idle.
func TestEndgameSkipsClaimedPiece(t *testing.T) {
	url := startSignal(t)
	data := randBytes(72, 2<<20)
	a, b := newTestNode(t, url, nil), newTestNode(t, url, nil)
	inf := put(t, a.st, data)
	put(t, b.st, data)
	leech := newTestNode(t, url, nil)
	var once sync.Once
	hooks := &fetchHooks{verified: func(peer.ID, cas.CID, int64, int64) {
		once.Do(func() { time.Sleep(3 * endgameAfter) })
	}}
	if _, err := leech.Fetch(ctxFor(t, time.Minute), leech.st, inf.CID, FetchOptions{Peers: []peer.ID{a.ID(), b.ID()}, hooks: hooks}); err != nil {
		t.Fatal(err)
	}
	if got := leech.Stats().FetchedBytes; got != int64(len(data)) {
		t.Fatalf("fetched %d bytes of a %d-byte blob", got, len(data))
	}
}

// Two peers that stall (a peer killed mid-transfer stalls until its
// connection times out) and one that answers: a piece whose first
// request and whose endgame copy both went to stalled peers gets a third
// request after endgameAgain, so the tail is not held for the 20 s the
// stalled peers take (nor for a request timeout).
func TestEndgameTwoStalledPeers(t *testing.T) {
	url := startSignal(t)
	stall := func(c *Config) {
		c.testHooks.serve = func(l *link, ch *channel, job serveJob) error {
			if job.n < 1<<20 {
				return l.serveOne(ch, job) // the size proof
			}
			select {
			case <-time.After(20 * time.Second):
			case <-l.done:
			}
			return l.serveOne(ch, job)
		}
	}
	slow1, slow2 := newTestNode(t, url, stall), newTestNode(t, url, stall)
	fast := newTestNode(t, url, nil)
	data := randBytes(48, 8<<20+5)
	inf := put(t, fast.st, data)
	put(t, slow1.st, data)
	put(t, slow2.st, data)
	fetcher := newTestNode(t, url, nil)
	start := time.Now()
	if _, err := fetcher.Fetch(ctxFor(t, time.Minute), fetcher.st, inf.CID, FetchOptions{Peers: []peer.ID{slow1.ID(), slow2.ID(), fast.ID()}}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if !bytes.Equal(readAll(t, fetcher.st, inf.CID), data) {
		t.Fatal("copy differs")
	}
	if took > 12*time.Second {
		t.Fatalf("fetch took %v: two stalled peers held the tail (they answer after 20 s)", took)
	}
	if got := fetcher.Stats().FetchedBytes; got != int64(len(data)) {
		t.Fatalf("fetched %d bytes of a %d-byte blob", got, len(data))
	}
	t.Logf("fetched in %v", took.Round(time.Millisecond))
}

// Among the open blobs, a worker takes pieces first from those that the
// fewest providers hold whole (blob order among equals), so that the
// blobs left with the fewest copies when holders die are completed
// first.
func TestRarestBlobsFirst(t *testing.T) {
	s := newScheduler(&fetcher{}, 1<<20, 8)
	x, y, z := peer.ID("x"), peer.ID("y"), peer.ID("z")
	blob := func(name string, whole, partial []peer.ID) *blobJob {
		b := &blobJob{w: &want{cid: cas.Sum([]byte(name))}, has: map[peer.ID]bool{}, bits: map[peer.ID][]byte{}}
		for _, p := range whole {
			b.has[p] = true
		}
		for _, p := range partial {
			b.has[p] = true
			b.bits[p] = []byte{1}
		}
		return b
	}
	two := blob("two", []peer.ID{x, y}, []peer.ID{z})
	one := blob("one", []peer.ID{x}, []peer.ID{y, z})
	three := blob("three", []peer.ID{x, y, z}, nil)
	oneToo := blob("one too", []peer.ID{y}, nil)
	s.open = []*blobJob{two, one, three, oneToo}
	s.mu.Lock()
	got := s.rarestBlobs()
	s.mu.Unlock()
	want := []*blobJob{one, oneToo, two, three}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("blob %d is %s; want %s", i, got[i].w.cid, want[i].w.cid)
		}
	}
	if len(s.open) != 4 || s.open[0] != two {
		t.Fatal("rarestBlobs reordered the open blobs")
	}
}
