package swarm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
)

// haveLiar claims, in HAVE bitmaps, every piece of the blobs it names
// and holds none: its Source holds nothing whole, and every request it
// gets it refuses as not_found.
type haveLiar struct {
	Source
	sizes map[cas.CID]int64 // by raw CID
}

func (h *haveLiar) Stat(c cas.CID) (cas.Info, error) {
	return cas.Info{}, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

func (h *haveLiar) PartialVerified(c cas.CID) (int64, []uint64, bool) {
	size, ok := h.sizes[c.Raw()]
	if !ok {
		return 0, nil, false
	}
	groups := make([]uint64, (bao.Groups(size)+63)/64)
	for i := range groups {
		groups[i] = ^uint64(0)
	}
	return size, groups, true
}

func (h *haveLiar) AppendPartialSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	return dst, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

// A peer that lies in HAVE (claims every piece of every shard and
// refuses each request as not_found) is banned, and the fetch completes
// from the honest peer without waiting on it. (A seeder leaves to
// partial holders the pieces they announce, so the liar is asked for
// pieces of many shards at once; it is banned at its third refused
// shard.)
func TestHaveLiarBanned(t *testing.T) {
	url := startSignal(t)
	data := randBytes(71, 16*(1<<20)+333)
	// The seed answers each request 20 ms late: its shards then stay
	// open long enough for the leecher to learn the liar's HAVE of them
	// and ask it (on a loaded machine the seed otherwise served all but
	// two of them before the liar's bitmaps arrived: two refusals, no ban).
	seed := newTestNode(t, url, func(c *Config) {
		c.testHooks.serve = func(l *link, ch *channel, job serveJob) error {
			time.Sleep(20 * time.Millisecond)
			return l.serveOne(ch, job)
		}
	})
	root, col := smallCollection(t, seed.st, data, 1<<20)
	lie := &haveLiar{sizes: map[cas.CID]int64{}}
	for _, sh := range col.Shards {
		lie.sizes[sh.CID.Raw()] = sh.Size
	}
	liar := newTestNode(t, url, func(c *Config) { lie.Source = c.Source; c.Source = lie })
	leech := newTestNode(t, url, nil)
	start := time.Now()
	if _, err := leech.Fetch(ctxFor(t, time.Minute), leech.st, root.CID, FetchOptions{Peers: []peer.ID{liar.ID(), seed.ID()}}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if !bytes.Equal(readAll(t, leech.st, root.CID), data) {
		t.Fatal("fetched file differs")
	}
	if !leech.Banned(liar.ID()) || leech.Banned(seed.ID()) {
		t.Fatalf("banned: liar %v, seed %v; want the liar only (events %+v)", leech.Banned(liar.ID()), leech.Banned(seed.ID()), leech.Events())
	}
	if took > 20*time.Second {
		t.Errorf("fetch took %v: the liar held it up", took)
	}
	t.Logf("fetched %d bytes in %v; events %+v", len(data), took.Round(time.Millisecond), leech.Events())
}

// A download closed unfinished is retracted (an empty HAVE bitmap): a
// peer that was waiting for its pieces learns that it will not get them
// and gives up on it at once (nobody has the blob), instead of waiting
// for the stall deadline.
func TestRetractClosedDownload(t *testing.T) {
	url := startSignal(t)
	var served atomic.Int64
	// The seeder serves the first two pieces, then nothing.
	seed := newTestNode(t, url, func(c *Config) {
		c.testHooks.serve = func(l *link, ch *channel, job serveJob) error {
			if job.n >= 1<<20 && served.Add(1) > 2 {
				<-l.done
				return nil
			}
			return l.serveOne(ch, job)
		}
	})
	data := randBytes(73, 8<<20)
	inf, col := smallCollection(t, seed.st, data, 8<<20) // one shard: its size is known to b
	shard := col.Shards[0].CID
	a := newTestNode(t, url, nil)
	actx, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Fetch(actx, a.st, inf.CID, FetchOptions{Peers: []peer.ID{seed.ID()}})
		aDone <- err
	}()
	waitUntil(t, 20*time.Second, func() bool {
		_, groups, ok := a.st.PartialVerified(shard)
		return ok && countUnits(PieceBitmap(int64(len(data)), groups)) >= 2
	})
	// b fetches from a alone: it gets a's two pieces, then waits for more.
	b := newTestNode(t, url, nil)
	bDone := make(chan error, 1)
	go func() {
		_, err := b.Fetch(ctxFor(t, time.Minute), b.st, inf.CID, FetchOptions{Peers: []peer.ID{a.ID()}, FindTimeout: time.Second, StallTimeout: 40 * time.Second})
		bDone <- err
	}()
	waitUntil(t, 20*time.Second, func() bool {
		_, groups, ok := b.st.PartialVerified(shard)
		return ok && countUnits(PieceBitmap(int64(len(data)), groups)) >= 2
	})
	cancelA()
	<-aDone
	stopped := time.Now()
	select {
	case err := <-bDone:
		if !errors.Is(err, ErrNoProviders) {
			t.Fatalf("b's fetch: %v; want ErrNoProviders", err)
		}
		t.Logf("b gave up %v after a closed its download", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(15 * time.Second):
		t.Fatal("b still waits for a's pieces 15 s after a closed its download")
	}
	if b.Banned(a.ID()) {
		t.Fatal("b banned a, which retracted what it announced")
	}
}

func waitUntil(t *testing.T, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met in %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
