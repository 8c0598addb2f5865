package swarm

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// wakeRound is a scheduler with one open blob of four 1 MiB pieces, held
// whole by seed and in part by each of partial (bitmaps given), every peer
// with one worker's link, and no network.
func wakeRound(t *testing.T, seed peer.ID, partial map[peer.ID][]byte) (*scheduler, map[peer.ID]*link) {
	t.Helper()
	cfg, err := Config{Identity: &Identity{}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{cfg: cfg, fetching: newFetchBudget(cfg.FetchBudget, cfg.MaxFetchRequests)}
	s := newScheduler(&fetcher{n: n}, 1<<20, 8)
	const size = 4 << 20
	b := &blobJob{w: &want{cid: cas.Sum([]byte("wake")), size: size}, has: map[peer.ID]bool{}, bits: map[peer.ID][]byte{}, flying: map[*piece]struct{}{}, left: size}
	b.todo, _ = cutPieces([]cas.Range{{Off: 0, Len: size}}, 1<<20)
	for _, pc := range b.todo {
		pc.b = b
	}
	links := map[peer.ID]*link{}
	add := func(p peer.ID) {
		b.has[p] = true
		s.workers[p] = 1
		links[p] = &link{remote: p, done: make(chan struct{})}
	}
	if seed != "" {
		add(seed)
	}
	for p, bm := range partial {
		add(p)
		b.bits[p] = bm
		s.watch[p] = true
	}
	s.open = []*blobJob{b}
	s.jobs[b.w.cid.Raw()] = b
	return s, links
}

// nextAsync runs s.next for l's peer in a goroutine; its piece (or nil)
// comes on the channel.
func nextAsync(s *scheduler, l *link) <-chan *piece {
	got := make(chan *piece, 1)
	go func() { got <- s.next(context.Background(), l, wire.MaxRequest) }()
	return got
}

// waitParked waits until ok, called under s.mu, says a worker is parked
// in next (what it checks is set under s.mu right before the worker
// waits).
func waitParked(t *testing.T, s *scheduler, ok func() bool) {
	t.Helper()
	for {
		s.mu.Lock()
		done := ok()
		s.mu.Unlock()
		if done {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func recvPiece(t *testing.T, got <-chan *piece, who string) *piece {
	t.Helper()
	select {
	case pc := <-got:
		if pc == nil {
			t.Fatalf("%s's worker got no piece", who)
		}
		return pc
	case <-time.After(10 * time.Second):
		t.Fatalf("%s's worker was not woken", who)
	}
	return nil
}

// A seeder's worker that found every piece left to a partial provider
// with room waits; once that provider's pipeline is full, the worker is
// woken and takes a piece (the provider's own progress wakes only its own
// workers, so this must not depend on it).
func TestWakeSeederWhenPartialProviderFull(t *testing.T) {
	seed, leech := peer.ID("seed"), peer.ID("leech")
	s, links := wakeRound(t, seed, map[peer.ID][]byte{leech: {0x0f}})
	got := nextAsync(s, links[seed])
	waitParked(t, s, func() bool { return s.leavers[seed] })
	s.mu.Lock()
	room := s.pipeline(leech)
	s.mu.Unlock()
	for range room {
		if pc := s.next(context.Background(), links[leech], wire.MaxRequest); pc == nil {
			t.Fatal("the partial provider got no piece")
		}
	}
	pc := recvPiece(t, got, "the seeder")
	if pc.peer != seed {
		t.Fatalf("the piece is in flight with %s; want %s", pc.peer, seed)
	}
}

// A worker with nothing it could take is woken by its own peer's
// announcement of pieces that are still wanted.
func TestWakeOnAnnouncement(t *testing.T) {
	a, b := peer.ID("a"), peer.ID("b")
	s, links := wakeRound(t, "", map[peer.ID][]byte{a: {0x01}, b: {0x02}})
	for p, off := range map[peer.ID]int64{a: 0, b: 1 << 20} {
		if pc := s.next(context.Background(), links[p], wire.MaxRequest); pc == nil || pc.off != off {
			t.Fatalf("%s got %v; want the piece at %d", p, pc, off)
		}
	}
	// b has room for another piece but holds none that is free: it waits.
	got := nextAsync(s, links[b])
	waitParked(t, s, func() bool { return s.idle[b] != nil })
	blob := s.open[0]
	s.peerHas(b, []wire.HaveEntry{{CID: blob.w.cid.Raw(), Size: uint64(blob.w.size), Bitmap: []byte{0x06}}})
	if pc := recvPiece(t, got, "b"); pc.off != 2<<20 {
		t.Fatalf("b got the piece at %d; want %d", pc.off, 2<<20)
	}
}

func TestUnitsCover(t *testing.T) {
	for _, tc := range []struct {
		bm, old []byte
		want    bool
	}{
		{[]byte{0x0f}, []byte{0x05}, true},
		{[]byte{0x0f}, []byte{0x0f}, true},
		{[]byte{0x0e}, []byte{0x0f}, false},
		{[]byte{0x00, 0x01}, []byte{0x00, 0x03}, false},
		{[]byte{0x01}, []byte{0x01, 0x00}, true},
		{[]byte{0x01}, []byte{0x01, 0x80}, false},
		{[]byte{0x01}, nil, true},
	} {
		if got := unitsCover(tc.bm, tc.old); got != tc.want {
			t.Errorf("unitsCover(%x, %x) = %v; want %v", tc.bm, tc.old, got, tc.want)
		}
	}
}
