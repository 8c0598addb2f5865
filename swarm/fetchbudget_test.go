package swarm

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// stallPieces makes a node answer the REQUESTs for whole pieces never (a
// peer that is slow or stops answering), and the rest (size proofs, and
// blobs listed in serve) as usual.
func stallPieces(serve ...cas.CID) func(*Config) {
	return func(c *Config) {
		c.testHooks.serve = func(l *link, ch *channel, job serveJob) error {
			for _, s := range serve {
				if job.cid.Digest() == s.Digest() {
					return l.serveOne(ch, job)
				}
			}
			if job.n < 1<<20 {
				return l.serveOne(ch, job)
			}
			<-l.done
			return nil
		}
	}
}

// pending returns what n's REQUESTs in flight hold at the wire, per peer:
// the calls its links wait on and the slice buffers they assemble.
func pending(n *Node) (reqs map[peer.ID]int, held map[peer.ID]int64) {
	reqs, held = map[peer.ID]int{}, map[peer.ID]int64{}
	n.mu.Lock()
	var ls []*link
	for _, pl := range n.links {
		ls = append(ls, pl...)
	}
	n.mu.Unlock()
	for _, l := range ls {
		l.mu.Lock()
		for _, c := range l.calls {
			if !c.want {
				reqs[l.remote]++
				held[l.remote] += int64(cap(c.buf))
			}
		}
		l.mu.Unlock()
	}
	return reqs, held
}

// Requests to peers that never answer hold at most the fetch budget,
// however many fetches ask them: per peer a quarter of its bytes and of
// its requests, and in all the whole. Without the bound each fetch sends
// each peer minPipeline requests (as it delivers nothing), each with a
// 1 MiB buffer, and more fetches more.
func TestFetchBudgetBoundsStalledPeers(t *testing.T) {
	cases := []struct {
		name            string
		stallers        int // each holds its own blob, fetched by fetches fetches
		fetches         int
		budget, maxReqs int
		atLeast         int // requests in flight in all once the fetches run
	}{
		// 16 MiB: 4 MiB a peer, three 1 MiB slices.
		{"bytes per peer", 1, 3, 16 << 20, 256, 3},
		// Six peers with room for three each, 15 slices in all. (Two
		// fetches each: a peer that delivers nothing gets two pieces of
		// a fetch in flight, pipeline.go.)
		{"bytes in all", 6, 2, 16 << 20, 256, 15},
		// 8 requests: 2 a peer.
		{"requests per peer", 2, 2, 128 << 20, 8, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := startSignal(t)
			var ids []peer.ID
			var blobs []cas.CID
			for i := range tc.stallers {
				s := newTestNode(t, url, stallPieces())
				ids = append(ids, s.ID())
				blobs = append(blobs, put(t, s.st, randBytes(uint64(100+i), 8<<20)).CID)
			}
			fetcher := newTestNode(t, url, func(c *Config) {
				c.FetchBudget, c.MaxFetchRequests = tc.budget, tc.maxReqs
				c.RequestTimeout = 2 * time.Minute // nothing times out
			})
			ctx, cancel := context.WithCancel(ctxFor(t, 2*time.Minute))
			var wg sync.WaitGroup
			for i, c := range blobs {
				for range tc.fetches {
					wg.Add(1)
					go func() {
						defer wg.Done()
						fetcher.Fetch(ctx, fetcher.st, c, FetchOptions{Peers: []peer.ID{ids[i]}, MaxPeers: 1, StallTimeout: 2 * time.Minute})
					}()
				}
			}
			defer func() { cancel(); wg.Wait() }()
			peerBytes, peerReqs := int64(tc.budget/fetchPeerShare), tc.maxReqs/fetchPeerShare
			check := func() (n int) {
				t.Helper()
				reqs, held := pending(fetcher.Node)
				var all int64
				for p, k := range reqs {
					n += k
					all += held[p]
					if k > peerReqs || held[p] > peerBytes {
						t.Fatalf("%d requests holding %d bytes in flight to %s; want at most %d and %d bytes", k, held[p], p, peerReqs, peerBytes)
					}
				}
				if n > tc.maxReqs || all > int64(tc.budget) {
					t.Fatalf("%d requests holding %d bytes in flight; want at most %d and %d bytes", n, all, tc.maxReqs, tc.budget)
				}
				if st := fetcher.Stats(); st.FetchingBytes > int64(tc.budget) || st.FetchRequests > tc.maxReqs {
					t.Fatalf("stats: %d bytes in %d requests held; want at most %d and %d", st.FetchingBytes, st.FetchRequests, tc.budget, tc.maxReqs)
				}
				return n
			}
			for check() < tc.atLeast {
				if ctx.Err() != nil {
					t.Fatal("requests never got under way")
				}
				time.Sleep(10 * time.Millisecond)
			}
			// The requests that were let through are out; any beyond
			// the bound would follow at once.
			for range 20 {
				time.Sleep(20 * time.Millisecond)
				check()
			}
		})
	}
}

// countingStore counts the downloads open at once (and the most seen),
// before the node's slot of each is given back.
type countingStore struct {
	Store
	open, peak *atomic.Int64
}

func (s countingStore) OpenPartial(c cas.CID, size int64) (Partial, error) {
	p, err := s.Store.OpenPartial(c, size)
	if err != nil {
		return nil, err
	}
	n := s.open.Add(1)
	for {
		if m := s.peak.Load(); n <= m || s.peak.CompareAndSwap(m, n) {
			break
		}
	}
	return &countedPartial{Partial: p, open: s.open}, nil
}

type countedPartial struct {
	Partial
	once sync.Once
	open *atomic.Int64
}

func (p *countedPartial) Close() error {
	p.once.Do(func() { p.open.Add(-1) })
	return p.Partial.Close()
}

func (p *countedPartial) Finish(ctx context.Context) (cas.Info, error) {
	p.once.Do(func() { p.open.Add(-1) })
	return p.Partial.Finish(ctx)
}

// Concurrent fetches of collections open at most MaxOpenBlobs downloads
// in all (each alone would open 16), and all of them complete: a fetch
// that waits for a slot is not starved by the others.
func TestFetchesShareOpenBlobs(t *testing.T) {
	url := startSignal(t)
	seeder := newTestNode(t, url, nil)
	const fetches, limit = 3, 2
	type coll struct {
		root cas.CID
		data []byte
	}
	var cols []coll
	for i := range fetches {
		data := randBytes(uint64(200+i), 8*(256<<10))
		inf, _ := smallCollection(t, seeder.st, data, 256<<10)
		cols = append(cols, coll{inf.CID, data})
	}
	fetcher := newTestNode(t, url, func(c *Config) { c.MaxOpenBlobs = limit })
	var open, peak atomic.Int64
	st := countingStore{Store: casStore{fetcher.st}, open: &open, peak: &peak}
	var wg sync.WaitGroup
	errs := make([]error, fetches)
	for i, c := range cols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = fetcher.FetchTo(ctxFor(t, time.Minute), st, c.root, FetchOptions{Peers: []peer.ID{seeder.ID()}})
		}()
	}
	wg.Wait()
	for i, c := range cols {
		if errs[i] != nil {
			t.Fatalf("fetch %d: %v", i, errs[i])
		}
		if !bytes.Equal(readAll(t, fetcher.st, c.root), c.data) {
			t.Fatalf("fetch %d: copy differs", i)
		}
	}
	if got := peak.Load(); got > limit {
		t.Fatalf("%d downloads open at once; want at most %d", got, limit)
	}
	if got := open.Load(); got != 0 {
		t.Fatalf("%d downloads left open", got)
	}
	t.Logf("at most %d open", peak.Load())
}
