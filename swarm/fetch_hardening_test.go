package swarm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
)

// sizeLiar announces made-up sizes for some blobs (by digest: the wire
// names blobs by digest, whatever their CID's codec) and answers requests
// for them with slices of the right length for that size, whose bytes are
// garbage.
type sizeLiar struct {
	Source
	mu  sync.Mutex
	lie map[cas.Digest]int64
}

func (s *sizeLiar) setLies(lie map[cas.Digest]int64) {
	s.mu.Lock()
	s.lie = lie
	s.mu.Unlock()
}

func (s *sizeLiar) lieFor(c cas.CID) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sz, ok := s.lie[c.Digest()]
	return sz, ok
}

func (s *sizeLiar) Stat(c cas.CID) (cas.Info, error) {
	inf, err := s.Source.Stat(c)
	if sz, ok := s.lieFor(c); ok && err == nil {
		inf.Size = sz
	}
	return inf, err
}

func (s *sizeLiar) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	sz, ok := s.lieFor(c)
	if !ok {
		return s.Source.AppendSlice(dst, c, off, n)
	}
	start := len(dst)
	dst = append(dst, make([]byte, cas.SliceLen(sz, off, n))...)
	binary.LittleEndian.PutUint64(dst[start:], uint64(sz))
	for i := start + 8; i < len(dst); i++ {
		dst[i] = byte(i * 7)
	}
	return dst, nil
}

// smallCollection stores data in st as a collection of shards of at most
// shard bytes (AddFile makes 64 MiB shards; tests want many small ones).
func smallCollection(t testing.TB, st *cas.Store, data []byte, shard int) (cas.Info, *cas.Collection) {
	t.Helper()
	col := &cas.Collection{Size: int64(len(data))}
	for off := 0; off < len(data); off += shard {
		inf := put(t, st, data[off:min(off+shard, len(data))])
		col.Shards = append(col.Shards, cas.Shard{CID: inf.CID, Size: inf.Size})
	}
	inf, err := st.PutCollection(context.Background(), col)
	if err != nil {
		t.Fatal(err)
	}
	return inf, col
}

// A peer's HAVE is its word: a size for the root that is absurd, past the
// limit, plausible but wrong, or zero, and a shard size that its verified
// collection contradicts, must not open (or allocate) anything of that
// size; the liars are banned and the fetch completes from the honest peer.
func TestFetchSurvivesLyingSizes(t *testing.T) {
	url := startSignal(t)
	data := randBytes(21, 3*40<<10+5)
	honest := newTestNode(t, url, nil)
	root, col := smallCollection(t, honest.st, data, 40<<10)
	liars := make([]*sizeLiar, 2)
	var liarIDs []peer.ID
	for i := range liars {
		liars[i] = &sizeLiar{}
		n := newTestNode(t, url, func(c *Config) { liars[i].Source = c.Source; c.Source = liars[i] })
		smallCollection(t, n.st, data, 40<<10)
		liarIDs = append(liarIDs, n.ID())
	}
	const limit = 1 << 20
	sizes := map[cas.CID]int64{root.CID: root.Size}
	for _, sh := range col.Shards {
		sizes[sh.CID] = sh.Size
	}
	cases := []struct {
		name string
		cid  cas.CID
		size int64
	}{
		{"root 2^61", root.CID, 1 << 61},
		{"root past the limit", root.CID, limit + 1},
		{"root one group more", root.CID, root.Size + cas.GroupSize},
		{"root one byte less", root.CID, root.Size - 1},
		{"root empty", root.CID, 0},
		{"shard one byte more", col.Shards[1].CID, col.Shards[1].Size + 1},
		{"shard 2^61", col.Shards[2].CID, 1 << 61},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, l := range liars {
				l.setLies(map[cas.Digest]int64{tc.cid.Digest(): tc.size})
			}
			fetcher := newTestNode(t, url, nil)
			var mu sync.Mutex
			var opened []int64
			var bad []string
			opt := FetchOptions{
				// The liars first, so that they are asked (and, where
				// they are the majority, believed) before the honest one.
				Peers:       append(slices.Clone(liarIDs), honest.ID()),
				MaxBlobSize: limit,
				FindTimeout: 2 * time.Minute, // generous: a loaded machine connects slowly
				hooks: &fetchHooks{opened: func(c cas.CID, size int64) {
					mu.Lock()
					defer mu.Unlock()
					opened = append(opened, size)
					if size != sizes[c] {
						bad = append(bad, c.String())
					}
				}},
			}
			if _, err := fetcher.Fetch(ctxFor(t, 3*time.Minute), fetcher.st, root.CID, opt); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(readAll(t, fetcher.st, root.CID), data) {
				t.Fatal("fetched file differs")
			}
			mu.Lock()
			defer mu.Unlock()
			if len(bad) > 0 {
				t.Fatalf("opened %v with a size a liar announced (sizes opened: %v)", bad, opened)
			}
			for _, id := range liarIDs {
				if !fetcher.Banned(id) {
					t.Errorf("liar %s not banned", id)
				}
			}
			if fetcher.Banned(honest.ID()) {
				t.Error("honest peer banned")
			}
		})
	}
}

// A collection of thousands of shards is fetched through a bounded window
// of open blobs: open Partials (a file and an outboard each) and the
// process's open files stay bounded whatever the shard count.
func TestFetchManyShardsBoundedOpen(t *testing.T) {
	shards := 5000
	if testing.Short() {
		shards = 1000
	}
	url := startSignal(t)
	seeder := newTestNode(t, url, nil)
	data := randBytes(33, shards*1024-77)
	root, _ := smallCollection(t, seeder.st, data, 1024)
	fetcher := newTestNode(t, url, nil)
	if err := fetcher.Connect(ctxFor(t, 20*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	const window = 8
	baseFDs := openFDs(t)
	var mu sync.Mutex
	var open, maxOpen, maxFDs, opens int
	opt := FetchOptions{
		Peers:       []peer.ID{seeder.ID()},
		OpenBlobs:   window,
		FindTimeout: 2 * time.Minute,
		hooks: &fetchHooks{
			opened: func(cas.CID, int64) {
				mu.Lock()
				defer mu.Unlock()
				open++
				opens++
				maxOpen = max(maxOpen, open)
				if opens%50 == 0 { // sampled: reading /proc costs
					maxFDs = max(maxFDs, openFDs(t))
				}
			},
			closed: func(cas.CID) {
				mu.Lock()
				open--
				mu.Unlock()
			},
		},
	}
	if _, err := fetcher.Fetch(ctxFor(t, 5*time.Minute), fetcher.st, root.CID, opt); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, fetcher.st, root.CID), data) {
		t.Fatal("fetched file differs")
	}
	mu.Lock()
	defer mu.Unlock()
	if opens < shards {
		t.Fatalf("opened %d partials; want at least %d (one per shard)", opens, shards)
	}
	if maxOpen > window || open != 0 {
		t.Fatalf("open partials: at most %d at once, %d at the end; want <= %d and 0", maxOpen, open, window)
	}
	// Links (UDP sockets) come and go; a few dozen files beside the window
	// is what the process needs, not one per shard.
	if maxFDs > baseFDs+window+64 {
		t.Fatalf("open files peaked at %d (%d before the fetch); window %d", maxFDs, baseFDs, window)
	}
}

func openFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count open files: %v", err)
	}
	return len(ents)
}

// badServer answers HAVE honestly, then misbehaves when asked for data:
// "stall" never answers, "short" sends a slice 100 bytes short.
type badServer struct {
	Source
	mode    string
	release chan struct{}
	calls   atomic.Int64
}

func (s *badServer) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	s.calls.Add(1)
	switch s.mode {
	case "stall":
		<-s.release
		return dst, errors.New("test over")
	case "short":
		out, err := s.Source.AppendSlice(dst, c, off, n)
		if err != nil {
			return out, err
		}
		return out[:len(out)-100], nil
	}
	return s.Source.AppendSlice(dst, c, off, n)
}

// newBadServer starts a node that holds data and misbehaves as mode says.
func newBadServer(t *testing.T, url, mode string, data []byte) (*testNode, *badServer) {
	bs := &badServer{mode: mode, release: make(chan struct{})}
	n := newTestNode(t, url, func(c *Config) { bs.Source = c.Source; c.Source = bs })
	// Registered after the node's cleanup, so it runs first: the stalled
	// serve goroutines return before the node waits for them.
	t.Cleanup(func() { close(bs.release) })
	put(t, n.st, data)
	return n, bs
}

// Peers that announce a blob and then stall, or send short slices, are
// dropped after a few strikes and their pieces go to the honest peer: the
// fetch completes, and the bad peers got a bounded number of requests.
func TestFetchDropsStallingPeers(t *testing.T) {
	for _, mode := range []string{"stall", "short"} {
		t.Run(mode, func(t *testing.T) {
			url := startSignal(t)
			data := randBytes(41, 6<<20+3)
			honest := newTestNode(t, url, nil)
			inf := put(t, honest.st, data)
			bad1, _ := newBadServer(t, url, mode, data)
			bad2, _ := newBadServer(t, url, mode, data)
			fetcher := newTestNode(t, url, nil)
			var mu sync.Mutex
			requests := map[peer.ID]int{}
			opt := FetchOptions{
				Peers: []peer.ID{bad1.ID(), bad2.ID(), honest.ID()},
				// Short enough for a quick test, long enough that the
				// honest peer answers in time on a loaded machine.
				RequestTimeout: 2 * time.Second,
				StallTimeout:   time.Minute,
				FindTimeout:    2 * time.Minute,
				hooks: &fetchHooks{requested: func(p peer.ID, _ cas.CID, _, _ int64) {
					mu.Lock()
					requests[p]++
					mu.Unlock()
				}},
			}
			if _, err := fetcher.Fetch(ctxFor(t, 3*time.Minute), fetcher.st, inf.CID, opt); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(readAll(t, fetcher.st, inf.CID), data) {
				t.Fatal("fetched blob differs")
			}
			// One window of requests, then one at a time until dropped
			// (and perhaps the size probe).
			limit := fetcher.cfg.Links*fetcher.cfg.Window + defaultMaxStrikes + 1
			mu.Lock()
			defer mu.Unlock()
			for i, id := range []peer.ID{bad1.ID(), bad2.ID()} {
				t.Logf("bad peer %d got %d requests", i+1, requests[id])
				if requests[id] > limit {
					t.Errorf("bad peer %d got %d requests; want <= %d", i+1, requests[id], limit)
				}
			}
			if requests[honest.ID()] == 0 {
				t.Error("no request went to the honest peer")
			}
		})
	}
}

// When the only provider stalls, the fetch fails with an error that says
// so (it does not hang): by dropping the peer after its strikes, or, if
// strikes never add up, by the stall deadline.
func TestFetchOnlyProviderStalls(t *testing.T) {
	url := startSignal(t)
	data := randBytes(43, 1<<20)
	bad, _ := newBadServer(t, url, "stall", data)
	inf := cas.Sum(data)
	cases := []struct {
		name    string
		opt     FetchOptions
		want    error
		message string
	}{
		{"strikes", FetchOptions{}, ErrNoProviders, "dropped " + bad.ID().String()},
		{"stall deadline", FetchOptions{MaxStrikes: 1 << 20, StallTimeout: 2 * time.Second}, ErrStalled, "no verified data"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fetcher := newTestNode(t, url, nil)
			opt := tc.opt
			opt.Peers = []peer.ID{bad.ID()}
			opt.RequestTimeout = 500 * time.Millisecond
			_, err := fetcher.Fetch(ctxFor(t, time.Minute), fetcher.st, inf, opt)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("fetch: %v; want %v saying %q", err, tc.want, tc.message)
			}
		})
	}
}

// Eclipse: idle peers whose IDs sort before the honest seeder's fill the
// first places of the topic's member list. The fetch asks peers at random
// and widens the search while nobody asked has the blob.
func TestFetchFindsSeederBehindIdlePeers(t *testing.T) {
	url := startSignal(t)
	const topic = "eclipse"
	data := randBytes(45, 200<<10)
	// Idle members: signed in and in the topic, never answering an offer,
	// with IDs that sort before the seeder's (a seeder whose ID sorts
	// early is replaced: few IDs could sort before it).
	const nIdle = defaultMaxPeers + 2
	var pool []*Identity
	for range 4 * nIdle {
		id, err := NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		pool = append(pool, id)
	}
	var seeder *testNode
	var idle []*Identity
	for tries := 0; len(idle) < nIdle; tries++ {
		if tries == 20 {
			t.Fatal("no seeder ID sorts after enough others")
		}
		seeder = newTestNode(t, url, nil)
		idle = slices.DeleteFunc(slices.Clone(pool), func(id *Identity) bool { return id.ID.String() > seeder.ID().String() })
	}
	inf := put(t, seeder.st, data)
	if _, err := seeder.sig.Join(ctxFor(t, 10*time.Second), topic); err != nil {
		t.Fatal(err)
	}
	for _, id := range idle[:nIdle] {
		sc, err := signaling.Dial(ctxFor(t, 10*time.Second), url, signaling.ClientConfig{Key: id.Key})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sc.Close() })
		if _, err := sc.Join(ctxFor(t, 10*time.Second), topic); err != nil {
			t.Fatal(err)
		}
	}
	// Idle peers cost a connect timeout per round: short, but long enough
	// for the seeder on a loaded machine.
	fetcher := newTestNode(t, url, func(c *Config) { c.ConnectTimeout = 5 * time.Second })
	members, err := fetcher.sig.Peers(ctxFor(t, 10*time.Second), topic)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(members, seeder.ID()); i < defaultMaxPeers {
		t.Fatalf("seeder is member %d of %d; the test needs it past the first %d", i, len(members), defaultMaxPeers)
	}
	opt := FetchOptions{
		Discover:    func(ctx context.Context) ([]peer.ID, error) { return fetcher.sig.Peers(ctx, topic) },
		FindTimeout: 2 * time.Minute,
	}
	if _, err := fetcher.Fetch(ctxFor(t, 3*time.Minute), fetcher.st, inf.CID, opt); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, fetcher.st, inf.CID), data) {
		t.Fatal("fetched blob differs")
	}
}
