package swarm

import (
	"bytes"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// The slice of a range is the concatenation of its chunks' tails, for
// ranges that start and end anywhere in blobs of awkward sizes.
func TestSliceChunksConcatenate(t *testing.T) {
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, size := range []int64{1, cas.GroupSize, cas.GroupSize + 1, serveChunk, serveChunk + 1, 3*serveChunk + 5*cas.GroupSize + 77, 4<<20 + 3} {
		inf := put(t, st, randBytes(uint64(size), int(size)))
		groups := (size + cas.GroupSize - 1) / cas.GroupSize
		for _, r := range [][2]int64{{0, groups}, {1, groups}, {0, groups - 1}, {groups / 3, groups - groups/3}, {groups - 1, groups}} {
			off, end := r[0]*cas.GroupSize, min(r[1]*cas.GroupSize, size)
			if off >= end {
				continue
			}
			n := min(end-off, wire.MaxRequest)
			want, err := st.AppendSlice(nil, inf.CID, off, n)
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			for a := off; a < off+n; {
				k := chunkAt(size, off, n, a)
				sub, err := st.AppendSlice(nil, inf.CID, k.a, k.b-k.a)
				if err != nil {
					t.Fatal(err)
				}
				if int64(len(sub)) != k.sub || k.pos != int64(len(got)) {
					t.Fatalf("size %d [%d, %d) chunk at %d: sub %d, pos %d; want %d, %d", size, off, off+n, a, len(sub), len(got), k.sub, k.pos)
				}
				got = append(got, sub[k.sub-k.add:]...)
				a = k.b
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("size %d [%d, %d): chunked slice differs from the whole (%d vs %d bytes)", size, off, off+n, len(got), len(want))
			}
		}
	}
}

// mapSource serves Stat from a map and no data: enough to answer WANTs for
// thousands of blobs without storing them.
type mapSource map[cas.CID]int64

func (m mapSource) Stat(c cas.CID) (cas.Info, error) {
	size, ok := m[c]
	if !ok {
		return cas.Info{}, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
	}
	return cas.Info{CID: c, Size: size}, nil
}

func (m mapSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	return dst, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

// A WANT for the 6,000 shards of a big collection is answered completely:
// the WANTs are cut so that each HAVE fits a frame (it did not, from 1,599
// CIDs, and the link closed with frame_too_large).
func TestWantThousandsOfShards(t *testing.T) {
	const shards = 6000
	src := mapSource{}
	var cids []cas.CID
	for i := range shards {
		c := cas.Sum(fmt.Appendf(nil, "shard %d", i))
		cids = append(cids, c)
		if i%3 != 0 { // the seeder holds two thirds
			src[c] = int64(i + 1)
		}
	}
	url := startSignal(t)
	seeder := newTestNode(t, url, func(c *Config) { c.Source = src })
	fetcher := newTestNode(t, url, func(c *Config) { c.Links = 1 })
	if err := fetcher.Connect(ctxFor(t, 20*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	l := fetcher.linksTo(seeder.ID())[0]
	// Ask for some twice: each is listed once.
	ask := append(append([]cas.CID(nil), cids...), cids[:100]...)
	have, err := l.want(ctxFor(t, 30*time.Second), ask)
	if err != nil {
		t.Fatalf("want %d CIDs: %v", len(ask), err)
	}
	got := map[cas.CID]int64{}
	for _, e := range have {
		got[e.CID] = int64(e.Size)
	}
	if len(have) != len(src) || len(got) != len(src) {
		t.Fatalf("HAVE listed %d entries, %d distinct; want %d", len(have), len(got), len(src))
	}
	for c, size := range src {
		if got[c] != size {
			t.Fatalf("%s: size %d; want %d", c, got[c], size)
		}
	}
	if l.isClosed() {
		t.Fatalf("link closed: %v", l.errClosed())
	}
}

// countingSource counts the slice bytes a Source gave out.
type countingSource struct {
	Source
	read atomic.Int64
}

func (s *countingSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	before := len(dst)
	dst, err := s.Source.AppendSlice(dst, c, off, n)
	s.read.Add(int64(len(dst) - before))
	return dst, err
}

// Peers that open connections with 16 bulk channels, queue 4 MiB requests
// on each and never read hold at most the serving budget (their share of
// it), not 4 MiB per channel; an honest peer is served meanwhile; and
// everything is given back when they go.
func TestServeBudgetBoundsNonReadingPeers(t *testing.T) {
	const budget = 4 << 20
	url := startSignal(t)
	var src *countingSource
	seeder := newTestNode(t, url, func(c *Config) {
		src = &countingSource{Source: c.Source}
		c.Source = src
		c.ServeBudget = budget
	})
	big := put(t, seeder.st, randBytes(61, 8<<20))
	small := put(t, seeder.st, randBytes(62, 1<<20))
	const attackers, linksEach = 2, 2
	var links []*link
	for range attackers {
		a := newTestNode(t, url, func(c *Config) {
			c.Links = linksEach
			c.BulkChannels = maxBulk
			c.testHooks.noReadBulk = true
		})
		if err := a.Connect(ctxFor(t, 30*time.Second), seeder.ID()); err != nil {
			t.Fatal(err)
		}
		links = append(links, a.linksTo(seeder.ID())...)
	}
	if len(links) != attackers*linksEach {
		t.Fatalf("%d attacking links; want %d", len(links), attackers*linksEach)
	}
	ctx := ctxFor(t, 60*time.Second)
	for _, l := range links {
		for i := range 48 {
			off := int64(i%2) * wire.MaxRequest
			cl, err := l.newCall(false, nil, int(cas.SliceLen(big.Size, off, wire.MaxRequest)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.ctl.write(ctx, wire.AppendRequest(nil, cl.req, big.CID, uint64(off), wire.MaxRequest)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// What the seeder may have read: the budget, plus what the attackers'
	// SCTP stacks took into their receive windows (and acknowledged)
	// without the application reading, plus a chunk per channel of
	// rounding.
	bound := int64(budget) + int64(len(links))*(sctpRecvBuffer+maxBulk*serveChunkBuf)
	check := func() {
		t.Helper()
		used := seeder.Stats().ServingBytes
		if r := src.read.Load(); r > bound || used > budget {
			t.Fatalf("seeder read %d slice bytes and holds %d; want at most %d and %d", r, used, bound, budget)
		}
	}
	// Let the attack fill the budget (bounded wait), checking throughout.
	for i := 0; i < 400; i++ {
		check()
		if used, _ := seeder.budget.held(""); used >= budget*3/8 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	// An honest peer is served meanwhile.
	honest := newTestNode(t, url, func(c *Config) { c.Links = 1 })
	if err := honest.Connect(ctxFor(t, 30*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	hl := honest.linksTo(seeder.ID())[0]
	slice, err := hl.request(ctxFor(t, 30*time.Second), small.CID, small.Size, 0, small.Size, nil)
	if err != nil {
		t.Fatalf("honest request during the attack: %v", err)
	}
	if want, _ := seeder.st.AppendSlice(nil, small.CID, 0, small.Size); !bytes.Equal(slice, want) {
		t.Fatal("honest request during the attack: wrong slice")
	}
	for i := 0; i < 40; i++ {
		check()
		time.Sleep(25 * time.Millisecond)
	}
	seeder.budget.mu.Lock()
	peak, perPeer := seeder.budget.peak, seeder.budget.byPeer
	for p, n := range perPeer {
		if n > seeder.budget.perPeer {
			t.Errorf("peer %s holds %d; share %d", p, n, seeder.budget.perPeer)
		}
	}
	seeder.budget.mu.Unlock()
	t.Logf("seeder read %d bytes (bound %d); budget peak %d of %d", src.read.Load(), bound, peak, budget)
	// The attackers go: everything they held is given back.
	for _, l := range links {
		l.shutdown(wire.CodeGoingAway, "done", ErrClosed)
	}
	for i := 0; ; i++ {
		used, _ := seeder.budget.held("")
		if used == 0 {
			break
		}
		if i == 400 {
			t.Fatalf("seeder still holds %d serving bytes after the attackers left", used)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// A REQUEST longer than max_request (or of length 0) is refused with
// bad_request, as the spec says, and the connection stays.
func TestRequestLengthRejected(t *testing.T) {
	a, _, l := connected(t)
	inf := put(t, a.st, randBytes(7, 5<<20))
	for _, n := range []int64{wire.MaxRequest + cas.GroupSize, 0} {
		_, err := l.request(ctxFor(t, 10*time.Second), inf.CID, inf.Size, 0, n, nil)
		var rej *RejectError
		if !errors.As(err, &rej) || rej.Code != wire.CodeBadRequest {
			t.Errorf("REQUEST of %d bytes: %v; want REJECT bad_request", n, err)
		}
	}
	if _, err := l.request(ctxFor(t, 10*time.Second), inf.CID, inf.Size, 0, wire.MaxRequest, nil); err != nil {
		t.Fatalf("good request after rejected ones: %v", err)
	}
}
