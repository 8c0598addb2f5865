package swarm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// FetchOptions says where a fetch looks for a blob.
type FetchOptions struct {
	// Peers to ask (connected ones are asked too).
	Peers []peer.ID
	// Discover, if set, is called for more peers when nobody asked so far
	// has what is missing (for example: the members of a signaling topic).
	Discover func(ctx context.Context) ([]peer.ID, error)
	// FindTimeout bounds how long a fetch waits without progress for a
	// peer that has what is missing (default 30s).
	FindTimeout time.Duration
	// MaxPeers bounds the peers a fetch connects to (default 8).
	MaxPeers int
	// Progress, if set, is called after each verified piece with the bytes
	// written so far and the bytes this fetch had to get. Calls come one at
	// a time from the fetch's goroutines; it must not block.
	Progress func(done, total int64)
}

// Fetch makes blob c present in st, and if c is a collection, every shard
// it lists too. Pieces come from whichever connected peers have them, each
// 16 KiB group verified against its CID before it is written; a peer that
// sends a bad group is banned and its pieces are fetched from others. An
// interrupted fetch resumes from the groups already verified in st.
func (n *Node) Fetch(ctx context.Context, st *cas.Store, c cas.CID, opt FetchOptions) (cas.Info, error) {
	if opt.FindTimeout <= 0 {
		opt.FindTimeout = 30 * time.Second
	}
	if opt.MaxPeers <= 0 {
		opt.MaxPeers = 8
	}
	f := &fetcher{n: n, st: st, opt: opt}
	if err := f.fetch(ctx, []want{{cid: c, size: -1}}); err != nil {
		return cas.Info{}, err
	}
	info, err := st.Stat(c)
	if err != nil {
		return cas.Info{}, err
	}
	if !info.Collection {
		return info, nil
	}
	// The store recognizes a collection when it completes and links its
	// shards, so GC keeps them while the shards are fetched.
	col, err := st.Collection(c)
	if err != nil {
		return cas.Info{}, err
	}
	var missing []want
	for _, sh := range col.Shards {
		if inf, err := st.Stat(sh.CID); err != nil || inf.Corrupt {
			missing = append(missing, want{cid: sh.CID, size: sh.Size})
		}
	}
	if err := f.fetch(ctx, missing); err != nil {
		return cas.Info{}, err
	}
	return info, nil
}

type want struct {
	cid  cas.CID
	size int64 // -1: unknown, ask the providers
}

type fetcher struct {
	n   *Node
	st  *cas.Store
	opt FetchOptions
}

// fetch gets every wanted blob, looking for providers again (and waiting
// up to FindTimeout without progress) while some are missing.
func (f *fetcher) fetch(ctx context.Context, wants []want) error {
	var lastErr error
	idle := time.Now()
	for {
		wants = slices.DeleteFunc(wants, func(w want) bool {
			inf, err := f.st.Stat(w.cid)
			return err == nil && !inf.Corrupt
		})
		if len(wants) == 0 {
			return nil
		}
		progressed, err := f.round(ctx, wants)
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if progressed {
			idle = time.Now()
			continue
		}
		if time.Since(idle) > f.opt.FindTimeout {
			if lastErr == nil {
				lastErr = ErrNoProviders
			}
			return fmt.Errorf("swarm: fetch %s (and %d more): %w", wants[0].cid, len(wants)-1, lastErr)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// candidates returns the peers to ask: given, connected and discovered.
func (f *fetcher) candidates(ctx context.Context) []peer.ID {
	ps := append(append([]peer.ID(nil), f.opt.Peers...), f.n.Peers()...)
	if f.opt.Discover != nil {
		if more, err := f.opt.Discover(ctx); err == nil {
			ps = append(ps, more...)
		}
	}
	seen := map[peer.ID]bool{f.n.ID(): true}
	out := ps[:0]
	for _, p := range ps {
		if !seen[p] && !f.n.Banned(p) {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out[:min(len(out), f.opt.MaxPeers)]
}

// round connects to the candidates, asks who has what, and runs one
// scheduler over everything someone has. It reports whether any piece was
// written.
func (f *fetcher) round(ctx context.Context, wants []want) (progressed bool, err error) {
	peers := f.candidates(ctx)
	cids := make([]cas.CID, len(wants))
	for j, w := range wants {
		cids[j] = w.cid
	}
	type answer struct {
		links []*link
		have  []wire.HaveEntry
	}
	answers := make([]answer, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One connection to ask; the rest only to peers that have
			// something.
			ls, err := f.n.connectN(ctx, p, 1)
			if err != nil {
				f.n.log.Debug("swarm: fetch: connect", "peer", p, "err", err)
				return
			}
			have, err := ls[0].want(ctx, cids)
			if err != nil {
				f.n.log.Debug("swarm: fetch: want", "peer", p, "err", err)
				return
			}
			if len(have) > 0 {
				if more, err := f.n.connect(ctx, p); err == nil {
					ls = more
				}
			}
			answers[i] = answer{ls, have}
		}()
	}
	wg.Wait()

	// Who has what, at which size. Sizes come from untrusted peers; the
	// CID commits to the size, so a liar's slices fail verification and it
	// is banned. Until then the most common claim wins.
	// Pieces no larger than any provider serves.
	step := int64(f.n.cfg.PieceSize)
	for _, a := range answers {
		for _, l := range a.links {
			step = min(step, int64(l.peerHello().MaxRequest)/cas.GroupSize*cas.GroupSize)
		}
	}
	s := newScheduler(f, step)
	for _, w := range wants {
		sizes := map[int64][]peer.ID{}
		for i, a := range answers {
			for _, e := range a.have {
				if e.CID == w.cid && e.Bitmap == nil && e.Size < 1<<62 && (w.size < 0 || int64(e.Size) == w.size) {
					sizes[int64(e.Size)] = append(sizes[int64(e.Size)], peers[i])
				}
			}
		}
		best, provs := int64(-1), []peer.ID(nil)
		for sz, ps := range sizes {
			if len(ps) > len(provs) || len(ps) == len(provs) && sz < best {
				best, provs = sz, ps
			}
		}
		if len(provs) == 0 {
			continue
		}
		if err := s.add(w.cid, best, provs); err != nil {
			s.closeAll()
			return false, err
		}
	}
	for i, a := range answers {
		if len(a.have) > 0 {
			s.links[peers[i]] = a.links
		}
	}
	return s.run(ctx)
}

// piece is one REQUEST's range of a blob.
type piece struct {
	b      *blobJob
	off, n int64
}

// blobJob is one blob being fetched.
type blobJob struct {
	cid  cas.CID
	size int64
	part *cas.Partial
	left int              // pieces not yet written
	has  map[peer.ID]bool // providers still believed to have it
}

// scheduler hands pieces to workers, Window per link, pieces in order
// (blobs in order), failed pieces first again. Every field after mu is
// guarded by it.
type scheduler struct {
	f     *fetcher
	step  int64 // piece size
	links map[peer.ID][]*link

	mu       sync.Mutex
	cond     *sync.Cond
	blobs    []*blobJob
	queue    []*piece
	inflight int
	err      error
	done     int64 // bytes written
	total    int64 // bytes this round had to get
	wrote    bool
}

func newScheduler(f *fetcher, step int64) *scheduler {
	s := &scheduler{f: f, step: step, links: map[peer.ID][]*link{}}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// add opens (or resumes) the download of c and queues what is missing.
func (s *scheduler) add(c cas.CID, size int64, providers []peer.ID) error {
	part, err := s.f.st.OpenPartial(c, size)
	if err != nil {
		return fmt.Errorf("swarm: fetch %s: %w", c, err)
	}
	b := &blobJob{cid: c, size: size, part: part, has: map[peer.ID]bool{}}
	for _, p := range providers {
		b.has[p] = true
	}
	s.blobs = append(s.blobs, b)
	step := s.step
	for _, r := range part.Missing() {
		for off := r.Off; off < r.Off+r.Len; off += step {
			s.queue = append(s.queue, &piece{b: b, off: off, n: min(step, r.Off+r.Len-off)})
			s.total += min(step, r.Off+r.Len-off)
			b.left++
		}
	}
	return nil
}

// closeAll releases the partials of blobs not finished (their progress is
// kept for a later resume).
func (s *scheduler) closeAll() {
	for _, b := range s.blobs {
		if b.part != nil {
			b.part.Close()
		}
	}
}

func (s *scheduler) run(ctx context.Context) (bool, error) {
	defer s.closeAll()
	// Blobs already complete (resumed to the end, or empty) only need
	// finishing.
	for _, b := range s.blobs {
		if b.left == 0 {
			if b.size == 0 {
				if err := b.part.WriteSlice(0, 0, nil); err != nil {
					return false, err
				}
			}
			if err := s.finish(ctx, b); err != nil {
				return false, err
			}
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	var wg sync.WaitGroup
	for _, ls := range s.links {
		for _, l := range ls {
			window := min(s.f.n.cfg.Window, int(l.peerHello().MaxOutstanding))
			for range window {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.worker(ctx, l)
				}()
			}
		}
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wrote, s.err
}

func (s *scheduler) finish(ctx context.Context, b *blobJob) error {
	part := b.part
	b.part = nil
	if _, err := part.Finish(ctx); err != nil {
		return fmt.Errorf("swarm: finish %s: %w", b.cid, err)
	}
	return nil
}

// next blocks until a piece that l's peer has is queued (and returns it),
// or until nothing is left that it could get.
func (s *scheduler) next(ctx context.Context, l *link) *piece {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.err != nil || ctx.Err() != nil || l.isClosed() || s.f.n.Banned(l.remote) {
			return nil
		}
		for i, p := range s.queue {
			if p.b.has[l.remote] {
				s.queue = slices.Delete(s.queue, i, i+1)
				s.inflight++
				return p
			}
		}
		if s.inflight == 0 {
			return nil
		}
		s.cond.Wait()
	}
}

// requeue puts p back at the front; lost reports that l's peer no longer
// has p's blob.
func (s *scheduler) requeue(p *piece, l *link, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lost {
		delete(p.b.has, l.remote)
	}
	s.queue = slices.Insert(s.queue, 0, p)
	s.inflight--
	s.cond.Broadcast()
}

func (s *scheduler) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
	s.cond.Broadcast()
}

func (s *scheduler) worker(ctx context.Context, l *link) {
	var buf []byte
	for {
		p := s.next(ctx, l)
		if p == nil {
			return
		}
		slice, err := l.request(ctx, p.b.cid, p.b.size, p.off, p.n, buf)
		if err != nil {
			var rej *RejectError
			lost := errors.As(err, &rej) && rej.Req != 0 && rej.Code != wire.CodeBusy && rej.Code != wire.CodeShuttingDown
			s.requeue(p, l, lost)
			if errors.As(err, &rej) && rej.Code == wire.CodeBusy {
				select {
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			continue
		}
		buf = slice
		if err := p.b.part.WriteSlice(p.off, p.n, slice); err != nil {
			var re *cas.RangeError
			if errors.As(err, &re) {
				s.f.n.punish(l.remote, re)
				s.requeue(p, l, true)
				return
			}
			s.requeue(p, l, false)
			s.fail(fmt.Errorf("swarm: write %s: %w", p.b.cid, err))
			return
		}
		s.f.n.stats.fetchedBytes.Add(p.n)
		s.mu.Lock()
		s.inflight--
		s.done += p.n
		s.wrote = true
		p.b.left--
		last := p.b.left == 0
		if s.f.opt.Progress != nil {
			s.f.opt.Progress(s.done, s.total)
		}
		s.cond.Broadcast()
		s.mu.Unlock()
		if last {
			if err := s.finish(ctx, p.b); err != nil {
				s.fail(err)
				return
			}
		}
	}
}
