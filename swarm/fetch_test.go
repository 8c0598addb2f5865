package swarm

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

func TestFetchSmallBlobs(t *testing.T) {
	url := startSignal(t)
	a := newTestNode(t, url, nil)
	b := newTestNode(t, url, nil)
	for _, size := range []int{0, 1, 16 << 10, 16<<10 + 1, 3<<20 + 12345} {
		data := randBytes(uint64(size), size)
		inf := put(t, a.st, data)
		got, err := b.Fetch(ctxFor(t, 30*time.Second), b.st, inf.CID, FetchOptions{Peers: []peer.ID{a.ID()}})
		if err != nil {
			t.Fatalf("size %d: fetch: %v", size, err)
		}
		if got.CID != inf.CID || got.Size != int64(size) {
			t.Fatalf("size %d: info %+v", size, got)
		}
		if !bytes.Equal(readAll(t, b.st, inf.CID), data) {
			t.Fatalf("size %d: fetched bytes differ", size)
		}
	}
	if n := b.Links(a.ID()); n != b.cfg.Links {
		t.Fatalf("links to a = %d; want %d", n, b.cfg.Links)
	}
}

// collectionSize is 200 MiB, or a little over one shard under -short (the
// race detector makes everything several times slower).
func collectionSize() int {
	if testing.Short() {
		return 64<<20 + 12345
	}
	return 200 << 20
}

func TestFetchCollectionByteExact(t *testing.T) {
	url := startSignal(t)
	a := newTestNode(t, url, nil)
	b := newTestNode(t, url, nil)
	data := randBytes(7, collectionSize())
	inf := addFile(t, a.st, data)
	if !inf.Collection {
		t.Fatalf("%d bytes were not stored as a collection", len(data))
	}
	var calls atomic.Int64
	got, err := b.Fetch(ctxFor(t, 3*time.Minute), b.st, inf.CID, FetchOptions{
		Peers:    []peer.ID{a.ID()},
		Progress: func(done, total int64) { calls.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.CID != inf.CID {
		t.Fatalf("info %+v", got)
	}
	if !bytes.Equal(readAll(t, b.st, inf.CID), data) {
		t.Fatal("fetched collection differs")
	}
	links, err := b.st.Links(inf.CID)
	if err != nil || len(links) != (len(data)+cas.ShardSize-1)/cas.ShardSize {
		t.Fatalf("links of the collection = %d, %v", len(links), err)
	}
	if calls.Load() == 0 {
		t.Fatal("no progress reported")
	}
	if s := b.Stats(); s.FetchedBytes < int64(len(data)) || s.BadSlices != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// flipSource serves genuine slices, except that it flips the byte of blob
// `at` that begins with needle (random data: unique) wherever it sends it.
type flipSource struct {
	Source
	at     cas.CID
	needle []byte
	flips  atomic.Int64
}

func (f *flipSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	start := len(dst)
	out, err := f.Source.AppendSlice(dst, c, off, n)
	if err == nil && c == f.at {
		if i := bytes.Index(out[start:], f.needle); i >= 0 {
			out[start+i] ^= 0x55
			f.flips.Add(1)
		}
	}
	return out, err
}

func TestBadPeerCaughtAndFetchCompletesFromHonestPeer(t *testing.T) {
	url := startSignal(t)
	size := 70 << 20 // two shards
	if testing.Short() {
		size = 20 << 20 // one blob
	}
	data := randBytes(11, size)
	honest := newTestNode(t, url, nil)
	inf := addFile(t, honest.st, data)
	target := cas.Shard{CID: inf.CID, Size: inf.Size}
	if inf.Collection {
		col, err := honest.st.Collection(inf.CID)
		if err != nil {
			t.Fatal(err)
		}
		target = col.Shards[0]
	}
	// The liar holds the same file, and flips one byte of the first shard
	// at 5 MiB + 100 whenever it serves it.
	const badOff = 5<<20 + 100
	flip := &flipSource{at: target.CID, needle: data[badOff : badOff+32]}
	liar := newTestNode(t, url, func(c *Config) { flip.Source = c.Source; c.Source = flip })
	addFile(t, liar.st, data)
	fetcher := newTestNode(t, url, nil)

	// From the liar alone the fetch cannot complete.
	_, err := fetcher.Fetch(ctxFor(t, time.Minute), fetcher.st, inf.CID, FetchOptions{Peers: []peer.ID{liar.ID()}, FindTimeout: time.Second})
	if !errors.Is(err, ErrNoProviders) {
		t.Fatalf("fetch from the liar: %v; want ErrNoProviders", err)
	}
	if flip.flips.Load() == 0 {
		t.Fatal("the liar never sent the flipped group")
	}
	// Caught at the first bad group, recorded with the peer's ID.
	var ev *Event
	for _, e := range fetcher.Events() {
		if e.Kind == EventBadData {
			ev = &e
			break
		}
	}
	groupOff := int64(badOff) / cas.GroupSize * cas.GroupSize
	if ev == nil || ev.Peer != liar.ID() || ev.CID != flip.at || ev.Off != groupOff || ev.Len != cas.GroupSize {
		t.Fatalf("bad-data event = %+v; want peer %s, cid %s, group [%d, +%d)", ev, liar.ID(), flip.at, groupOff, cas.GroupSize)
	}
	if !fetcher.Banned(liar.ID()) {
		t.Fatalf("liar not banned (links=%d)", fetcher.Links(liar.ID()))
	}
	// The ban closes its links; each goes once its close completes (a
	// link still being set up when the ban fell closes a moment later).
	waitFor(t, func() bool { return fetcher.Links(liar.ID()) == 0 })
	// The liar was told why.
	waitFor(t, func() bool {
		for _, e := range liar.Events() {
			if e.Kind == EventProtocol {
				return true
			}
		}
		return liar.Links(fetcher.ID()) == 0
	})
	// Nothing of the bad group was written; the good pieces were kept.
	p, err := fetcher.st.OpenPartial(flip.at, target.Size)
	if err != nil {
		t.Fatal(err)
	}
	if p.Have(groupOff, cas.GroupSize) {
		t.Fatal("the bad group is marked verified")
	}
	kept := target.Size - missingBytes(p)
	p.Close()
	if kept == 0 {
		t.Fatal("no good piece of the liar's was kept")
	}

	// An honest peer completes it, byte-exact, resuming what was verified.
	served := honest.Stats().ServedBytes
	if _, err := fetcher.Fetch(ctxFor(t, time.Minute), fetcher.st, inf.CID, FetchOptions{Peers: []peer.ID{honest.ID(), liar.ID()}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, fetcher.st, inf.CID), data) {
		t.Fatal("fetched file differs")
	}
	if again := honest.Stats().ServedBytes - served; again > int64(len(data))-kept+int64(fetcher.cfg.PieceSize) {
		t.Fatalf("honest peer served %d bytes; %d were already verified", again, kept)
	}
}

func missingBytes(p *cas.Partial) int64 {
	var n int64
	for _, r := range p.Missing() {
		n += r.Len
	}
	return n
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An interrupted fetch resumes from the groups already verified.
func TestFetchResumes(t *testing.T) {
	url := startSignal(t)
	a := newTestNode(t, url, nil)
	b := newTestNode(t, url, nil)
	size := 48 << 20
	if testing.Short() {
		size = 16 << 20
	}
	data := randBytes(3, size)
	inf := put(t, a.st, data)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var half int64
	_, err := b.Fetch(ctx, b.st, inf.CID, FetchOptions{
		Peers: []peer.ID{a.ID()},
		Progress: func(done, total int64) {
			if done >= total/2 && half == 0 {
				half = done
				cancel()
			}
		},
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted fetch: %v", err)
	}
	// What the first fetch verified (and kept when it stopped).
	p, err := b.st.OpenPartial(inf.CID, inf.Size)
	if err != nil {
		t.Fatal(err)
	}
	missing := missingBytes(p)
	p.Close()
	if missing == 0 || missing == inf.Size {
		t.Fatalf("%d of %d bytes missing after the interruption; the test needs some verified, some not", missing, inf.Size)
	}
	fetched := b.Stats().FetchedBytes
	// Groups requested, each counted once (a piece retried after a busy
	// answer is asked for twice).
	var mu sync.Mutex
	requested := map[int64]int64{}
	opt := FetchOptions{
		Peers: []peer.ID{a.ID()},
		hooks: &fetchHooks{requested: func(_ peer.ID, _ cas.CID, off, n int64) {
			mu.Lock()
			defer mu.Unlock()
			for g := off; g < off+n; g += cas.GroupSize {
				requested[g] = min(cas.GroupSize, off+n-g)
			}
		}},
	}
	if _, err := b.Fetch(ctxFor(t, time.Minute), b.st, inf.CID, opt); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, b.st, inf.CID), data) {
		t.Fatal("resumed fetch differs")
	}
	// The second fetch asked for what was missing and nothing else, but
	// for the blob's last group, which proves its size (and is written
	// if it was missing).
	mu.Lock()
	defer mu.Unlock()
	var got int64
	for _, n := range requested {
		got += n
	}
	if got < missing-cas.GroupSize || got > missing+cas.GroupSize {
		t.Fatalf("resumed fetch requested %d bytes; %d were missing", got, missing)
	}
	if got := b.Stats().FetchedBytes - fetched; got < missing-cas.GroupSize || got > missing {
		t.Fatalf("resumed fetch wrote %d bytes; %d were missing", got, missing)
	}
}

func TestFetchNotFound(t *testing.T) {
	url := startSignal(t)
	a := newTestNode(t, url, nil)
	b := newTestNode(t, url, nil)
	_, err := b.Fetch(ctxFor(t, 30*time.Second), b.st, cas.Sum([]byte("nobody has this")), FetchOptions{Peers: []peer.ID{a.ID()}, FindTimeout: 500 * time.Millisecond})
	if !errors.Is(err, ErrNoProviders) {
		t.Fatalf("fetch: %v; want ErrNoProviders", err)
	}
}

// Requests the protocol forbids are refused with a reason, the connection
// stays.
func TestBadRequestsRejected(t *testing.T) {
	url := startSignal(t)
	a := newTestNode(t, url, nil)
	b := newTestNode(t, url, nil)
	inf := put(t, a.st, randBytes(5, 1<<20))
	if err := b.Connect(ctxFor(t, 20*time.Second), a.ID()); err != nil {
		t.Fatal(err)
	}
	l := b.linksTo(a.ID())[0]
	cases := []struct {
		name   string
		cid    cas.CID
		off, n int64
		code   wire.Code
	}{
		{"unknown blob", cas.Sum([]byte("x")), 0, cas.GroupSize, wire.CodeNotFound},
		{"unaligned offset", inf.CID, 100, cas.GroupSize, wire.CodeBadRequest},
		{"past the end", inf.CID, 1 << 20, cas.GroupSize, wire.CodeBadRequest},
		{"ragged length", inf.CID, 0, 1000, wire.CodeBadRequest},
	}
	for _, tc := range cases {
		_, err := l.request(ctxFor(t, 10*time.Second), tc.cid, inf.Size, tc.off, tc.n, nil)
		var rej *RejectError
		if !errors.As(err, &rej) || rej.Code != tc.code || rej.Reason == "" {
			t.Errorf("%s: %v; want REJECT %v with a reason", tc.name, err, tc.code)
		}
	}
	if _, err := l.request(ctxFor(t, 10*time.Second), inf.CID, inf.Size, 0, inf.Size, nil); err != nil {
		t.Fatalf("good request after rejected ones: %v", err)
	}
}
