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

// piece is one REQUEST's range of a blob.
type piece struct {
	b      *blobJob
	off, n int64
	avoid  peer.ID // the peer that last failed it: others get it first
}

// blobJob is one blob of a round. It is pending until it is opened (a
// Partial: a file and an outboard), open while its pieces are handed out,
// and finished or closed when its last piece is written or nobody left has
// it. Guarded by scheduler.mu, except part, which its opener sets before
// the job becomes open.
type blobJob struct {
	w        *want
	part     *cas.Partial
	ranges   []cas.Range // missing bytes not handed out yet, in order
	retry    []*piece    // pieces handed back (at most the pieces in flight)
	inflight int
	left     int64            // bytes not yet written
	has      map[peer.ID]bool // providers still believed to have it, with workers
}

func (b *blobJob) remaining() bool { return len(b.retry) > 0 || len(b.ranges) > 0 }

// take hands out a piece for p: one handed back first (unless p failed it
// and someone else has the blob), then the next range in order.
func (b *blobJob) take(p peer.ID, step int64) *piece {
	for i, pc := range b.retry {
		if pc.avoid != p || len(b.has) == 1 {
			b.retry = slices.Delete(b.retry, i, i+1)
			return pc
		}
	}
	if len(b.ranges) == 0 {
		return nil
	}
	r := &b.ranges[0]
	pc := &piece{b: b, off: r.Off, n: min(step, r.Len)}
	r.Off += pc.n
	r.Len -= pc.n
	if r.Len == 0 {
		b.ranges = b.ranges[1:]
	}
	return pc
}

// scheduler runs one round: workers, Window per link, take pieces in blob
// order from at most `window` open blobs, opening the next pending blob as
// one finishes, so that a collection of thousands of shards holds a
// bounded number of files and outboards. Every field after mu is guarded
// by it.
type scheduler struct {
	f      *fetcher
	step   int64 // piece size
	window int   // open blobs
	links  map[peer.ID][]*link

	mu        sync.Mutex
	cond      *sync.Cond
	pending   []*blobJob // FIFO from head
	head      int
	waiting   map[peer.ID]int // pending blobs each peer has
	open      []*blobJob
	busy      int // blobs being opened or finished (they hold a Partial too)
	workers   map[peer.ID]int
	inflight  map[peer.ID]int
	providers map[peer.ID]bool
	err       error
	done      int64 // bytes written
	total     int64 // bytes this round has to get (an estimate until opened)
	wrote     bool
}

func newScheduler(f *fetcher, step int64, window int) *scheduler {
	s := &scheduler{
		f: f, step: step, window: window,
		links:     map[peer.ID][]*link{},
		waiting:   map[peer.ID]int{},
		workers:   map[peer.ID]int{},
		inflight:  map[peer.ID]int{},
		providers: map[peer.ID]bool{},
	}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// add queues blob w (its size known) with the peers that have it.
func (s *scheduler) add(w *want, providers []peer.ID) {
	b := &blobJob{w: w, has: make(map[peer.ID]bool, len(providers))}
	for _, p := range providers {
		b.has[p] = true
		s.waiting[p]++
		s.providers[p] = true
	}
	s.pending = append(s.pending, b)
	s.total += w.size
}

func (s *scheduler) hasPeer(p peer.ID) bool { return s.providers[p] }

func (s *scheduler) addLinks(p peer.ID, ls []*link) { s.links[p] = ls }

// run starts the workers and waits for them; it reports whether any piece
// was written. Blobs not finished are closed, their progress kept.
func (s *scheduler) run(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop()
	s.f.mu.Lock()
	s.f.sched = s
	s.f.mu.Unlock()
	defer func() {
		s.f.mu.Lock()
		s.f.sched = nil
		s.f.mu.Unlock()
	}()

	type job struct {
		l *link
		k int
	}
	var jobs []job
	s.mu.Lock()
	for p, ls := range s.links {
		for _, l := range ls {
			k := max(1, min(s.f.n.cfg.Window, int(l.peerHello().MaxOutstanding)))
			jobs = append(jobs, job{l, k})
			s.workers[p] += k
		}
	}
	// A provider without a link has no worker to serve its blobs.
	for p := range s.providers {
		if s.workers[p] == 0 {
			s.removePeerLocked(p)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, j := range jobs {
		for range j.k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.worker(ctx, j.l)
			}()
		}
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.open {
		s.closeBlob(b)
	}
	s.open = nil
	return s.wrote, s.err
}

// next blocks until there is a piece for l's peer (and returns it), or
// until nothing is left that it could get. Called without s.mu.
func (s *scheduler) next(ctx context.Context, l *link) *piece {
	p := l.remote
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.err != nil || ctx.Err() != nil || l.isClosed() || s.f.n.Banned(p) || s.f.dropped(p) {
			return nil
		}
		// A peer that failed gets one request at a time until it answers.
		if s.inflight[p] == 0 || !s.f.struck(p) {
			for _, b := range s.open {
				if !b.has[p] {
					continue
				}
				if pc := b.take(p, s.step); pc != nil {
					b.inflight++
					s.inflight[p]++
					return pc
				}
			}
			if len(s.open)+s.busy < s.window && s.head < len(s.pending) {
				s.openNext(ctx)
				continue
			}
		}
		if !s.mayGet(p) {
			return nil
		}
		s.cond.Wait()
	}
}

// mayGet reports whether p could still get a piece in this round. s.mu
// must be held.
func (s *scheduler) mayGet(p peer.ID) bool {
	if s.inflight[p] > 0 || s.busy > 0 || s.waiting[p] > 0 {
		return true
	}
	for _, b := range s.open {
		if b.has[p] && (b.inflight > 0 || b.remaining()) {
			return true
		}
	}
	return false
}

// openNext opens the next pending blob that someone still has. s.mu must
// be held; it is released while the store works.
func (s *scheduler) openNext(ctx context.Context) {
	b := s.pending[s.head]
	s.pending[s.head] = nil
	s.head++
	for p := range b.has {
		s.waiting[p]--
	}
	if len(b.has) == 0 {
		s.total -= b.w.size
		return
	}
	s.busy++
	s.mu.Unlock()
	err := s.openBlob(b)
	var ferr error
	if err == nil && b.left == 0 {
		ferr = s.finish(ctx, b) // resumed to the end, or empty
	}
	s.mu.Lock()
	s.busy--
	s.cond.Broadcast()
	s.total -= b.w.size - b.left
	// Peers removed while it was opened (it was neither pending nor open)
	// must not look like providers: others would leave them its pieces.
	for q := range b.has {
		if s.workers[q] == 0 {
			delete(b.has, q)
		}
	}
	switch {
	case err != nil:
		s.failLocked(err)
	case ferr != nil:
		s.failLocked(ferr)
	case b.left > 0:
		s.open = append(s.open, b)
	}
}

// openBlob opens (or resumes) the download of b, writes the slice that
// proved its size, and lists what is missing. Called without s.mu.
func (s *scheduler) openBlob(b *blobJob) error {
	w := b.w
	part, err := s.f.st.OpenPartial(w.cid, w.size)
	if err != nil {
		return fmt.Errorf("swarm: fetch %s: %w", w.cid, err)
	}
	if h := s.f.opt.hooks; h != nil && h.opened != nil {
		h.opened(w.cid, w.size)
	}
	b.part = part
	switch {
	case w.size == 0:
		if err := part.WriteSlice(0, 0, nil); err != nil {
			return fmt.Errorf("swarm: fetch %s: %w", w.cid, err)
		}
	case w.proof != nil:
		// Verified already; a failure here only means it is fetched again.
		off := (w.size - 1) / cas.GroupSize * cas.GroupSize
		if part.WriteSlice(off, w.size-off, w.proof) == nil {
			s.f.touch()
		}
		w.proof = nil
	}
	var ranges []cas.Range
	var left int64
	for _, r := range part.Missing() {
		ranges = append(ranges, r)
		left += r.Len
	}
	s.mu.Lock()
	b.ranges, b.left = ranges, left
	s.mu.Unlock()
	return nil
}

// finish completes b in the store. Called without s.mu, by the one
// goroutine that saw b's last byte written.
func (s *scheduler) finish(ctx context.Context, b *blobJob) error {
	part := b.part
	b.part = nil
	_, err := part.Finish(ctx)
	if h := s.f.opt.hooks; h != nil && h.closed != nil {
		h.closed(b.w.cid)
	}
	if err != nil {
		part.Close()
		return fmt.Errorf("swarm: finish %s: %w", b.w.cid, err)
	}
	return nil
}

// closeBlob closes b's Partial, keeping its progress. s.mu must be held.
func (s *scheduler) closeBlob(b *blobJob) {
	if b.part == nil {
		return
	}
	b.part.Close()
	b.part = nil
	if h := s.f.opt.hooks; h != nil && h.closed != nil {
		h.closed(b.w.cid)
	}
}

// orphaned closes b and drops it from the round if nobody left has it and
// nothing of it is in flight (a later round looks for it again). s.mu
// must be held.
func (s *scheduler) orphaned(b *blobJob) {
	if len(b.has) > 0 || b.inflight > 0 || b.part == nil {
		return
	}
	if i := slices.Index(s.open, b); i >= 0 {
		s.open = slices.Delete(s.open, i, i+1)
		s.closeBlob(b)
	}
}

// removePeer takes p off every blob of the round: it was dropped, or its
// last worker stopped.
func (s *scheduler) removePeer(p peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removePeerLocked(p)
}

func (s *scheduler) removePeerLocked(p peer.ID) {
	for _, b := range s.pending[s.head:] {
		delete(b.has, p)
	}
	s.waiting[p] = 0
	for _, b := range slices.Clone(s.open) {
		delete(b.has, p)
		s.orphaned(b)
	}
	s.cond.Broadcast()
}

// handBack returns pc, which p failed to get, to its blob; lost says p no
// longer has the blob.
func (s *scheduler) handBack(pc *piece, p peer.ID, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := pc.b
	b.inflight--
	s.inflight[p]--
	pc.avoid = p
	b.retry = append(b.retry, pc)
	if lost {
		delete(b.has, p)
		s.orphaned(b)
	}
	s.cond.Broadcast()
}

// wroteBytes records that the first n bytes of pc were written.
func (s *scheduler) wroteBytes(pc *piece, n int64) {
	s.f.touch()
	s.f.n.stats.fetchedBytes.Add(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	pc.off += n
	pc.n -= n
	pc.b.left -= n
	s.done += n
	s.wrote = true
	if s.f.opt.Progress != nil {
		s.f.opt.Progress(s.done, s.total)
	}
}

// pieceDone releases pc, all of it written by p, and finishes its blob if
// that was the last.
func (s *scheduler) pieceDone(ctx context.Context, pc *piece, p peer.ID) {
	b := pc.b
	s.mu.Lock()
	b.inflight--
	s.inflight[p]--
	last := b.left == 0 && b.inflight == 0 && b.part != nil
	if last {
		s.open = slices.DeleteFunc(s.open, func(o *blobJob) bool { return o == b })
		s.busy++
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	if !last {
		return
	}
	err := s.finish(ctx, b)
	s.mu.Lock()
	s.busy--
	if err != nil {
		s.failLocked(err)
	}
	s.cond.Broadcast()
	s.mu.Unlock()
}

func (s *scheduler) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failLocked(err)
}

func (s *scheduler) failLocked(err error) {
	if s.err == nil {
		s.err = err
	}
	s.cond.Broadcast()
}

// workerExit counts a stopped worker of p; with its last, p has nothing
// more to give this round.
func (s *scheduler) workerExit(p peer.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.workers[p]--
	if s.workers[p] == 0 {
		s.removePeerLocked(p)
	}
}

func (s *scheduler) worker(ctx context.Context, l *link) {
	defer s.workerExit(l.remote)
	// Pieces no larger than this peer serves (HELLO bounds max_request to
	// at least one group).
	maxReq := max(cas.GroupSize, int64(l.peerHello().MaxRequest)/cas.GroupSize*cas.GroupSize)
	var buf []byte
	for {
		pc := s.next(ctx, l)
		if pc == nil {
			return
		}
		if !s.get(ctx, l, pc, maxReq, &buf) {
			if ctx.Err() != nil || l.isClosed() {
				return
			}
			continue
		}
		s.pieceDone(ctx, pc, l.remote)
	}
}

// get requests pc from l, in requests of at most maxReq bytes, and writes
// what verifies. It reports whether all of pc was written; if not, pc was
// handed back.
func (s *scheduler) get(ctx context.Context, l *link, pc *piece, maxReq int64, buf *[]byte) bool {
	b := pc.b
	for pc.n > 0 {
		n := min(pc.n, maxReq)
		start := time.Now()
		s.f.opt.hooks.request(l.remote, b.w.cid, pc.off, n)
		rctx, cancel := context.WithTimeout(ctx, s.f.opt.RequestTimeout)
		slice, err := l.request(rctx, b.w.cid, b.w.size, pc.off, n, *buf)
		cancel()
		if err != nil {
			lost := false
			if ctx.Err() == nil {
				lost = s.f.requestFailed(l.remote, start, b.w.cid, err)
			}
			s.handBack(pc, l.remote, lost)
			var rej *RejectError
			if errors.As(err, &rej) && rej.Code == wire.CodeBusy {
				select {
				case <-time.After(50 * time.Millisecond):
				case <-ctx.Done():
				}
			}
			return false
		}
		*buf = slice
		if err := b.part.WriteSlice(pc.off, n, slice); err != nil {
			var re *cas.RangeError
			if errors.As(err, &re) {
				s.f.n.punish(l.remote, re)
				s.handBack(pc, l.remote, true)
				return false
			}
			s.handBack(pc, l.remote, false)
			s.fail(fmt.Errorf("swarm: write %s: %w", b.w.cid, err))
			return false
		}
		s.f.success(l.remote)
		s.wroteBytes(pc, n)
	}
	return true
}
