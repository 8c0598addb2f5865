package swarm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

	// In flight (guarded by scheduler.mu): who has it, since when, and
	// what stops its request.
	peer   peer.ID
	sent   time.Time
	cancel context.CancelFunc
	wrote  bool  // some of it was written
	queued bool  // its request waits for the download cap's turn (pace)
	dup    bool  // an endgame copy of another peer's piece
	race   *race // set when an endgame copy of it is in flight
}

// race is an endgame piece asked of two peers: the first answer that
// verifies claims it, and the other request is cancelled.
type race struct {
	claimed *piece
	runners []*piece
}

// Endgame: once every piece of the open blobs is handed out, a peer with
// nothing to do asks for a piece that has been in flight with another peer
// for endgameAfter, so that a slow peer does not hold the tail. One copy
// per piece at most.
const endgameAfter = 300 * time.Millisecond

// blobJob is one blob of a round. It is pending until it is opened (a
// Partial: a file and an outboard), open while its pieces are handed out,
// and finished or closed when its last piece is written or nobody left has
// it. Guarded by scheduler.mu, except part, which its opener sets before
// the job becomes open.
type blobJob struct {
	w        *want
	part     Partial
	todo     []*piece // missing pieces not handed out yet, in blob order
	flying   map[*piece]struct{}
	retry    []*piece // pieces handed back (at most the pieces in flight)
	inflight int
	left     int64            // bytes not yet written
	has      map[peer.ID]bool // providers still believed to have it, with workers
	// bits holds the HAVE bitmaps of the providers that hold only some
	// pieces (absent: the whole blob).
	bits    map[peer.ID][]byte
	pending bool // queued, not opened yet
}

func (b *blobJob) remaining() bool { return len(b.retry) > 0 || len(b.todo) > 0 }

// holds reports whether provider p has every piece unit of pc.
func (b *blobJob) holds(p peer.ID, pc *piece) bool {
	if !b.has[p] {
		return false
	}
	bm, partial := b.bits[p]
	return !partial || unitsHeld(bm, pc.off, pc.n)
}

// holders counts the providers that have pc.
func (b *blobJob) holders(pc *piece) int {
	n := 0
	for q := range b.has {
		if b.holds(q, pc) {
			n++
		}
	}
	return n
}

// take hands out a piece for p among those p has: one handed back first
// (unless p failed it and someone else has it), then the rarest of the
// rest across the providers, the tie broken at random (so that peers that
// start together fetch different pieces and have something to trade). In
// blob order if spread is false and every provider has every piece: no
// peer of the round could trade pieces. A provider of the whole blob
// leaves alone the pieces that a provider of some pieces has and has room
// to serve (spare): seeders upload what only they have. left reports
// that p was left a piece it has (its workers wait for such a provider's
// pipeline to fill: scheduler.leavers).
func (b *blobJob) take(p peer.ID, rng *rand.Rand, spread bool, spare func(peer.ID) bool) (pc *piece, left bool) {
	var room [][]byte // the bitmaps of the partial providers with room
	if _, partial := b.bits[p]; !partial {
		for q, bm := range b.bits {
			if q != p && spare(q) {
				room = append(room, bm)
			}
		}
	}
	leave := func(pc *piece) bool {
		for _, bm := range room {
			if unitsHeld(bm, pc.off, pc.n) {
				return true
			}
		}
		return false
	}
	for i, pc := range b.retry {
		if b.holds(p, pc) && (pc.avoid != p || b.holders(pc) == 1) {
			b.retry = slices.Delete(b.retry, i, i+1)
			return pc, false
		}
	}
	best, bestN, ties := -1, 0, 0
	inOrder := !spread && len(b.bits) == 0
	for i, pc := range b.todo {
		if !b.holds(p, pc) {
			continue
		}
		if leave(pc) {
			left = true
			continue
		}
		if inOrder {
			best = i
			break
		}
		switch k := b.holders(pc); {
		case best < 0 || k < bestN:
			best, bestN, ties = i, k, 1
		case k == bestN:
			if ties++; rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	if best < 0 {
		return nil, left
	}
	pc = b.todo[best]
	b.todo = slices.Delete(b.todo, best, best+1)
	return pc, false
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
	// mostInFlight is the most pieces one peer may have in flight: what
	// the node's fetch budget lets a peer hold.
	mostInFlight int

	mu sync.Mutex
	// links are the connections of each peer that takes part in the
	// round (a provider, or a watcher); more join while it runs (join).
	links map[peer.ID][]*link
	// ctx is run's; started says the workers run, live counts them, and
	// over is closed when the last one stops (ended): no link joins then.
	ctx     context.Context
	started bool
	ended   bool
	live    int
	over    chan struct{}
	// idle holds the condition each peer's workers wait on (all on mu):
	// what lets one peer's workers go on (a piece of its done, pieces it
	// announced) wakes those only (wake), not the workers of every peer
	// (about 144 in a 1 -> 9); what changes every peer's choices (a blob
	// opened or finished, a piece handed back, a provider gone, the end)
	// wakes all (wakeAll).
	idle map[peer.ID]*sync.Cond
	// leavers are the peers whose workers wait while pieces they have are
	// left to partial providers with room (blobJob.take): they are woken
	// when a provider's pipeline fills (fly).
	leavers map[peer.ID]bool
	rng     *rand.Rand
	jobs    map[cas.CID]*blobJob      // by raw CID
	watch   map[peer.ID]bool          // peers that may announce pieces (CapPartial)
	paths   map[peer.ID]*pathEstimate // what each peer delivered, how fast
	pending []*blobJob                // FIFO from head
	head    int
	waiting map[peer.ID]int // pending blobs each peer has
	open    []*blobJob
	order   []*blobJob // open, sorted by rarestBlobs
	// sorted says order is up to date: whatever changes open or the
	// providers of an open blob (has, bits) clears it.
	sorted    bool
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
		jobs:      map[cas.CID]*blobJob{},
		watch:     map[peer.ID]bool{},
		paths:     map[peer.ID]*pathEstimate{},
		idle:      map[peer.ID]*sync.Cond{},
		leavers:   map[peer.ID]bool{},
		rng:       rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		over:      make(chan struct{}),
	}
	if f.n != nil {
		b := f.n.fetching
		s.mostInFlight = min(b.peerReqs, int(b.peerBytes/maxSliceLen(step)))
	}
	return s
}

// wait parks one of p's workers until wake(p) or wakeAll. s.mu must be
// held.
func (s *scheduler) wait(p peer.ID) {
	c := s.idle[p]
	if c == nil {
		c = sync.NewCond(&s.mu)
		s.idle[p] = c
	}
	c.Wait()
}

// wake wakes p's waiting workers. s.mu must be held.
func (s *scheduler) wake(p peer.ID) {
	if c := s.idle[p]; c != nil {
		c.Broadcast()
	}
}

// wakeAll wakes every waiting worker. s.mu must be held.
func (s *scheduler) wakeAll() {
	for _, c := range s.idle {
		c.Broadcast()
	}
	clear(s.leavers)
}

// add queues blob w (its size known) with the peers that have it: whole,
// or the pieces of their bitmaps (bits[p], copied from the peer's HAVE).
func (s *scheduler) add(w *want, providers []peer.ID, bits map[peer.ID][]byte) {
	b := &blobJob{w: w, has: make(map[peer.ID]bool, len(providers)), bits: map[peer.ID][]byte{}, pending: true, flying: map[*piece]struct{}{}}
	for _, p := range providers {
		b.has[p] = true
		if bm, ok := bits[p]; ok {
			b.bits[p] = bm
		}
		s.waiting[p]++
		s.providers[p] = true
	}
	s.pending = append(s.pending, b)
	s.jobs[w.cid.Raw()] = b
	s.total += w.size
}

func (s *scheduler) hasPeer(p peer.ID) bool { return s.providers[p] }

func (s *scheduler) addLinks(p peer.ID, ls []*link) { s.links[p] = ls }

// join adds l, a connection that came up while the round is set up or
// runs, to the round if its peer takes part: its workers start at once
// if the others have (the fetcher widens to a provider in the background,
// fetcher.widen).
func (s *scheduler) join(l *link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ls, ok := s.links[l.remote]
	if !ok || s.ended || slices.Contains(ls, l) {
		return
	}
	s.links[l.remote] = append(ls, l)
	if s.started {
		s.spawn(l, s.countLocked(l))
	}
}

// countLocked counts l's workers, Window of them or as many requests as
// its peer takes, and returns how many; spawn starts them. s.mu must be
// held.
func (s *scheduler) countLocked(l *link) int {
	k := max(1, min(s.f.n.cfg.Window, int(l.peerHello().MaxOutstanding)))
	s.workers[l.remote] += k
	s.live += k
	return k
}

func (s *scheduler) spawn(l *link, k int) {
	for range k {
		go s.worker(s.ctx, l)
	}
}

// addWatcher gives p, which has nothing wanted yet but announces pieces as
// it gets them (CapPartial), workers that wait for its announcements.
func (s *scheduler) addWatcher(p peer.ID, ls []*link) {
	s.links[p] = ls
	s.watch[p] = true
}

// peerHas takes p's announcement of what it holds (copied entries): the
// blobs of this round it now holds whole or in part become p's to serve,
// if p takes part in the round.
func (s *scheduler) peerHas(p peer.ID, entries []wire.HaveEntry) {
	if s.f.n.Banned(p) || s.f.dropped(p) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers[p] == 0 {
		return // not in this round, or its workers stopped
	}
	changed := false
	others := false // whether the change may let other peers' workers go on
	for _, e := range entries {
		b := s.jobs[e.CID]
		if b == nil || e.Size != uint64(b.w.size) {
			continue // not wanted, or a size verified data contradicts
		}
		// (A blob already done takes it harmlessly: no worker takes
		// pieces of a blob that is not open. b.part is not read here: its
		// opener sets it without s.mu.)
		if e.Bitmap != nil && countUnits(e.Bitmap) == 0 {
			// A retraction: p closed its download of b.
			if b.has[p] {
				delete(b.has, p)
				delete(b.bits, p)
				if b.pending {
					s.waiting[p]--
				}
				s.orphaned(b)
				changed, others = true, true
			}
			continue
		}
		// Others may go on where p holds less than before (fewer holders
		// of a piece handed back; fewer pieces left to p: take) or now
		// holds the whole blob (take leaves nothing to it).
		if old, partial := b.bits[p]; b.has[p] && (partial && (e.Bitmap == nil || !unitsCover(e.Bitmap, old)) || !partial && e.Bitmap != nil) {
			others = true
		}
		if e.Bitmap == nil {
			delete(b.bits, p)
		} else {
			b.bits[p] = e.Bitmap
		}
		if !b.has[p] {
			b.has[p] = true
			if b.pending {
				s.waiting[p]++
			}
		}
		s.providers[p] = true
		changed = true
	}
	if !changed {
		return
	}
	s.sorted = false
	if others {
		s.wakeAll()
	} else {
		s.wake(p)
	}
}

// run starts the workers and waits for them; it reports whether any piece
// was written. Blobs not finished are closed, their progress kept.
func (s *scheduler) run(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		s.wakeAll()
		s.mu.Unlock()
	})
	defer stop()
	s.f.mu.Lock()
	s.f.sched = s
	s.f.mu.Unlock()
	defer func() {
		s.f.mu.Lock()
		s.f.sched, s.f.running = nil, false
		s.f.mu.Unlock()
	}()

	// Connections that came up since the round was set up join it; those
	// that come up from now on join through s.f.sched (fetcher.linkUp).
	s.mu.Lock()
	peers := make([]peer.ID, 0, len(s.links))
	for p := range s.links {
		peers = append(peers, p)
	}
	s.mu.Unlock()
	for _, p := range peers {
		for _, l := range s.f.n.linksTo(p) {
			s.join(l)
		}
	}
	type job struct {
		l *link
		k int
	}
	var jobs []job
	s.mu.Lock()
	// A provider without a link has no worker to serve its blobs.
	for p := range s.providers {
		if len(s.links[p]) == 0 {
			s.removePeerLocked(p)
		}
	}
	// The workers are counted first (peerHas takes announcements only
	// for peers with workers) and start once the early announcements are
	// applied; a link that joins from now on starts its own at once.
	s.ctx, s.started = ctx, true
	for _, ls := range s.links {
		for _, l := range ls {
			jobs = append(jobs, job{l, s.countLocked(l)})
		}
	}
	if s.live == 0 {
		s.ended = true
		close(s.over)
	}
	s.mu.Unlock()
	// Announcements from now on reach s directly; those that came before
	// (while peers were asked and sizes proven) are applied now.
	s.f.mu.Lock()
	s.f.running = true
	early := make(map[peer.ID][]wire.HaveEntry, len(s.f.early))
	for p, es := range s.f.early {
		early[p] = es
	}
	s.f.mu.Unlock()
	for p, es := range early {
		s.peerHas(p, es)
	}
	for _, j := range jobs {
		s.spawn(j.l, j.k)
	}
	<-s.over
	s.mu.Lock()
	defer s.mu.Unlock()
	// The downloads still open stay open for the next round (the fetcher
	// closes them when it ends): what they announced is still served.
	for _, b := range s.open {
		b.w.part, b.part = b.part, nil
	}
	s.open, s.sorted = nil, false
	return s.wrote, s.err
}

// next blocks until there is a piece for l's peer (and returns it), or
// until nothing is left that it could get. Called without s.mu.
func (s *scheduler) next(ctx context.Context, l *link, maxReq int64) *piece {
	p := l.remote
	s.mu.Lock()
	defer s.mu.Unlock()
	fly := func(b *blobJob, pc *piece) *piece {
		b.inflight++
		s.inflight[p]++
		pc.peer, pc.sent = p, time.Now()
		b.flying[pc] = struct{}{}
		if len(s.leavers) > 0 && !s.spare(p) {
			// p's pipeline is full: pieces left to it are free for others.
			for q := range s.leavers {
				s.wake(q)
			}
			clear(s.leavers)
		}
		return pc
	}
	var wake *time.Timer
	defer func() {
		if wake != nil {
			wake.Stop()
		}
	}()
	for {
		if s.err != nil || ctx.Err() != nil || l.isClosed() || s.f.n.Banned(p) || s.f.dropped(p) {
			return nil
		}
		left := false
		// A peer that failed gets one request at a time until it answers.
		if s.inflight[p] == 0 || !s.f.struck(p) && s.inflight[p] < s.pipeline(p) {
			for _, b := range s.rarestBlobs() {
				if !b.has[p] {
					continue
				}
				pc, skipped := b.take(p, s.rng, len(s.watch) > 0, s.spare)
				if pc != nil {
					return fly(b, pc)
				}
				left = left || skipped
			}
			if len(s.open)+s.busy < s.window && s.head < len(s.pending) {
				s.openNext(ctx)
				continue
			}
			if s.head == len(s.pending) {
				pc, after := s.endgame(p, maxReq)
				if pc != nil {
					return fly(pc.b, pc)
				}
				if after > 0 {
					if wake != nil {
						wake.Stop()
					}
					wake = time.AfterFunc(after, func() {
						s.mu.Lock()
						s.wake(p)
						s.mu.Unlock()
					})
				}
			}
		}
		if !s.mayGet(p) {
			return nil
		}
		if left {
			s.leavers[p] = true
		}
		s.wait(p)
	}
}

// rarestBlobs returns the open blobs, those that the fewest providers
// hold whole first (in blob order among equals): when holders die, the
// blobs left with the fewest copies are completed first: a completed
// blob is a copy that self-heal counts (Replicator), and pieces spread
// over every blob make none. The slice is kept, sorted, until the blobs or
// their providers change (s.sorted). s.mu must be held.
func (s *scheduler) rarestBlobs() []*blobJob {
	if s.sorted {
		return s.order
	}
	s.sorted = true
	s.order = append(s.order[:0], s.open...)
	if len(s.order) < 2 {
		return s.order
	}
	whole := func(b *blobJob) int {
		n := 0
		for q := range b.has {
			if _, partial := b.bits[q]; !partial {
				n++
			}
		}
		return n
	}
	slices.SortStableFunc(s.order, func(a, b *blobJob) int { return whole(a) - whole(b) })
	return s.order
}

// endgame returns a copy of a piece in flight with another peer for p to
// ask too, or how long until one may be asked. A piece gets a first copy
// once it has been in flight for endgameAfter, and another (up to
// maxRunners in all) while every request for it has been in flight for
// endgameAgain: a peer that died or stalls with a piece, and the peer its
// copy went to as well, do not hold the tail for a request timeout. s.mu
// must be held.
func (s *scheduler) endgame(p peer.ID, maxReq int64) (*piece, time.Duration) {
	now := time.Now()
	var after time.Duration
	wait := func(age, need time.Duration) bool {
		if age >= need {
			return false
		}
		if w := need - age; after == 0 || w < after {
			after = w
		}
		return true
	}
	for _, b := range s.open {
		if b.remaining() || !b.has[p] {
			continue
		}
		for pc := range b.flying {
			if pc.peer == p || pc.dup || pc.wrote || pc.queued || pc.n > maxReq || !b.holds(p, pc) {
				continue
			}
			r := pc.race
			if r == nil {
				if wait(now.Sub(pc.sent), endgameAfter) {
					continue
				}
				d := &piece{b: b, off: pc.off, n: pc.n, dup: true}
				pc.race = &race{runners: []*piece{pc, d}}
				d.race = pc.race
				return d, 0
			}
			if r.claimed != nil || len(r.runners) >= maxRunners {
				continue
			}
			newest, mine := time.Time{}, false
			for _, o := range r.runners {
				sent := o.sent
				if o.queued {
					sent = now // not asked yet: as if asked now
				}
				if _, ok := b.flying[o]; ok && sent.After(newest) {
					newest = sent
				}
				mine = mine || o.peer == p
			}
			if mine || newest.IsZero() || wait(now.Sub(newest), endgameAgain) {
				continue
			}
			d := &piece{b: b, off: pc.off, n: pc.n, dup: true, race: r}
			r.runners = append(r.runners, d)
			return d, 0
		}
	}
	return nil, after
}

// Endgame copies beyond the first: after endgameAgain with no answer from
// any runner, up to maxRunners requests for one piece.
const (
	endgameAgain = 10 * endgameAfter
	maxRunners   = 3
)

// claim decides an endgame race for pc, whose answer verified: it reports
// whether pc may be written (it is first), and cancels the other runner's
// request if so.
func (s *scheduler) claim(pc *piece) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := pc.race
	if r == nil {
		// Claimed alone: endgame must not start a copy of it now, in the
		// window before its bytes are written (the copy would claim it
		// too, and the piece be written twice).
		pc.race = &race{claimed: pc, runners: []*piece{pc}}
		return true
	}
	if r.claimed != nil {
		return r.claimed == pc
	}
	r.claimed = pc
	for _, o := range r.runners {
		if o != pc && o.cancel != nil {
			o.cancel()
		}
	}
	return true
}

// pace waits (within ctx) for the download cap's turn of pc's request of
// total bytes (Config.FetchRate). While it waits the piece is queued:
// endgame copies nothing of it, as its peer has not been asked yet.
func (s *scheduler) pace(ctx context.Context, pc *piece, total int64) error {
	fp := s.f.n.fetchPace
	if fp == nil {
		return nil
	}
	s.mu.Lock()
	pc.queued = true
	s.mu.Unlock()
	err := fp.wait(ctx, s.f.opt.Priority, total)
	s.mu.Lock()
	// In flight from now on: endgame's patience starts, and the workers
	// that passed it over look again (they set no timer for it).
	pc.queued, pc.sent = false, time.Now()
	s.wakeAll()
	s.mu.Unlock()
	return err
}

// sending records that pc's request is sent now: the time it waited for
// room in the fetch budget does not count towards endgame.
func (s *scheduler) sending(pc *piece) {
	s.mu.Lock()
	pc.sent = time.Now()
	s.mu.Unlock()
}

// lostRace reports whether pc's race was won by the other runner.
func (s *scheduler) lostRace(pc *piece) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return pc.race != nil && pc.race.claimed != nil && pc.race.claimed != pc
}

// pipeline is how many pieces p may have in flight (pipeline.go). s.mu
// must be held.
func (s *scheduler) pipeline(p peer.ID) int {
	if len(s.watch) == 0 {
		// Nobody to trade with: no piece needs keeping free for another
		// peer, so every worker, within the budget's share. (Sizing by
		// bandwidth x round trip here too cost a 1 -> 1 fetch on
		// loopback 97 MB/s against 112-127 MB/s: the least time to first
		// byte leaves out the peer's own serving time.)
		return max(s.mostInFlight, minPipeline)
	}
	e := s.paths[p]
	if e == nil {
		e = &pathEstimate{}
		s.paths[p] = e
	}
	return e.pipeline(s.f.n.cfg.Now(), s.step, s.mostInFlight)
}

// spare reports whether q can take another piece now. s.mu must be held.
func (s *scheduler) spare(q peer.ID) bool {
	return s.workers[q] > 0 && s.inflight[q] < s.pipeline(q) && (s.inflight[q] == 0 || !s.f.struck(q))
}

// delivered records that p answered a request of n bytes, whose first
// byte took ttfb.
func (s *scheduler) delivered(p peer.ID, n int64, ttfb time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.paths[p]
	if e == nil {
		e = &pathEstimate{}
		s.paths[p] = e
	}
	e.delivered(s.f.n.cfg.Now(), n, ttfb)
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
	if s.watch[p] {
		// p may yet announce pieces of a blob that someone is serving.
		for _, b := range s.open {
			if len(b.has) > 0 && (b.inflight > 0 || b.remaining()) {
				return true
			}
		}
		for _, b := range s.pending[s.head:] {
			if len(b.has) > 0 {
				return true
			}
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
	b.pending = false
	for p := range b.has {
		s.waiting[p]--
	}
	if len(b.has) == 0 {
		s.total -= b.w.size
		if b.w.part != nil {
			s.f.closePart(b.w) // nobody has it: a later round opens it again
		}
		return
	}
	s.busy++
	s.mu.Unlock()
	err := s.openBlob(ctx, b)
	var ferr error
	if err == nil && b.left == 0 {
		ferr = s.finish(ctx, b) // resumed to the end, or empty
	}
	s.mu.Lock()
	s.busy--
	s.wakeAll()
	s.sorted = false
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
		s.closeBlob(b) // if it was opened: its slot goes back
		s.failLocked(err)
	case ferr != nil:
		s.failLocked(ferr)
	case b.left > 0:
		s.open = append(s.open, b)
	}
}

// openBlob opens (or resumes) the download of b, writes the slice that
// proved its size, and lists what is missing. Called without s.mu.
func (s *scheduler) openBlob(ctx context.Context, b *blobJob) error {
	w := b.w
	part := w.part // kept open from an earlier round
	w.part = nil
	if part == nil {
		// A slot of the node's first: every fetch's downloads together
		// stay within Config.MaxOpenBlobs.
		slots := s.f.n.open
		if err := slots.take(ctx); err != nil {
			return fmt.Errorf("swarm: fetch %s: %w", w.cid, err)
		}
		p, err := s.f.st.OpenPartial(w.cid, w.size)
		if err != nil {
			slots.release()
			return fmt.Errorf("swarm: fetch %s: %w", w.cid, err)
		}
		part = &slotPartial{Partial: p, slots: slots}
		if h := s.f.opt.hooks; h != nil && h.opened != nil {
			h.opened(w.cid, w.size)
		}
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
		missing := slices.ContainsFunc(part.Missing(), func(r cas.Range) bool { return r.Off <= off && off < r.Off+r.Len })
		if s.f.writeSlice(part, w.cid, off, w.size-off, w.proof) == nil && missing {
			s.f.touch()
			s.f.n.stats.verified(w.size - off) // a group fetched (to prove the size)
		}
		w.proof = nil
	}
	todo, left := cutPieces(part.Missing(), s.step)
	s.mu.Lock()
	for _, pc := range todo {
		pc.b = b
	}
	b.todo, b.left = todo, left
	s.mu.Unlock()
	return nil
}

// cutPieces cuts the missing ranges into pieces of at most step bytes,
// none across a HAVE bitmap's piece unit (so that one bit says whether a
// peer has a piece), and returns them with the bytes they hold.
func cutPieces(missing []cas.Range, step int64) ([]*piece, int64) {
	var out []*piece
	var left int64
	for _, r := range missing {
		left += r.Len
		for off, end := r.Off, r.Off+r.Len; off < end; {
			n := min(step, end-off, (off/wire.PieceUnit+1)*wire.PieceUnit-off)
			out = append(out, &piece{off: off, n: n})
			off += n
		}
	}
	return out, left
}

// finish completes b in the store. Called without s.mu, by the one
// goroutine that saw b's last byte written.
func (s *scheduler) finish(ctx context.Context, b *blobJob) error {
	part := b.part
	b.part = nil
	_, err := part.Finish(ctx)
	if err == nil {
		s.f.n.markHave(b.w.cid)
	}
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
	b.w.part, b.part = b.part, nil
	s.f.closePart(b.w)
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
		s.sorted = false
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
	s.sorted = false
	s.wakeAll()
}

// handBack returns pc, which p failed to get, to its blob; lost says p no
// longer has the blob.
func (s *scheduler) handBack(pc *piece, p peer.ID, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := pc.b
	b.inflight--
	s.inflight[p]--
	delete(b.flying, pc)
	pc.cancel = nil
	if pc.dup {
		// An endgame copy: the piece itself is still in flight with its
		// first peer, unless this copy claimed it (then cancelled that
		// request) and failed to write it: then the piece goes back.
		if pc.race.claimed == pc {
			b.retry = append(b.retry, &piece{b: b, off: pc.off, n: pc.n, avoid: p})
		}
		if lost {
			delete(b.has, p)
			s.sorted = false
			s.orphaned(b)
		}
		s.wakeAll()
		return
	}
	pc.avoid = p
	if r := pc.race; r != nil && r.claimed == pc {
		pc.race = nil // the rest of a piece it claimed: nobody else runs for it
	}
	b.retry = append(b.retry, pc)
	if lost {
		delete(b.has, p)
		s.sorted = false
		s.orphaned(b)
	}
	s.wakeAll()
}

// wroteBytes records that the first n bytes of pc were written.
func (s *scheduler) wroteBytes(pc *piece, n int64) {
	s.f.touch()
	s.f.n.stats.verified(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	pc.off += n
	pc.n -= n
	pc.wrote = true
	pc.b.left -= n
	s.done += n
	s.wrote = true
	s.f.n.markHave(pc.b.w.cid)
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
	delete(b.flying, pc)
	pc.cancel = nil
	last := b.left == 0 && b.inflight == 0 && b.part != nil
	if last {
		s.open = slices.DeleteFunc(s.open, func(o *blobJob) bool { return o == b })
		s.sorted = false
		s.busy++
	}
	if b.inflight == 0 {
		s.wakeAll() // its last piece in flight: others may be done (mayGet)
	} else {
		s.wake(p) // room in p's pipeline; nothing new for others
	}
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
	s.wakeAll()
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
	s.wakeAll()
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
	if s.live--; s.live == 0 {
		s.ended = true
		close(s.over)
	}
}

func (s *scheduler) worker(ctx context.Context, l *link) {
	defer s.workerExit(l.remote)
	// Pieces no larger than this peer serves (HELLO bounds max_request to
	// at least one group).
	maxReq := max(cas.GroupSize, int64(l.peerHello().MaxRequest)/cas.GroupSize*cas.GroupSize)
	for {
		pc := s.next(ctx, l, maxReq)
		if pc == nil {
			return
		}
		switch s.get(ctx, l, pc, maxReq) {
		case gotPiece, lostRace:
			s.pieceDone(ctx, pc, l.remote)
		default:
			if ctx.Err() != nil || l.isClosed() {
				return
			}
		}
	}
}

// What get did with a piece.
type getResult int

const (
	gotPiece   getResult = iota // all of it written
	handedBack                  // not all: handed back (or, an endgame copy, dropped)
	lostRace                    // the other runner of its endgame race got it first
)

// get requests pc from l, in requests of at most maxReq bytes, and writes
// what verifies. Each request waits for room in the node's fetch budget
// before it is sent, and holds it until its slice is written or dropped.
func (s *scheduler) get(ctx context.Context, l *link, pc *piece, maxReq int64) getResult {
	b := pc.b
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	s.mu.Lock()
	pc.cancel = pcancel
	s.mu.Unlock()
	for pc.n > 0 {
		n := min(pc.n, maxReq)
		start := time.Now()
		budget := s.f.n.fetching
		total := cas.SliceLen(b.w.size, pc.off, n)
		var held int64
		err := s.pace(pctx, pc, total)
		if err == nil {
			held, err = s.f.n.admit(pctx, s.f.opt.Priority, l.remote, total, func() {
				s.f.opt.hooks.request(l.remote, b.w.cid, pc.off, n)
			})
		}
		if err != nil {
			if s.lostRace(pc) {
				return lostRace
			}
			s.handBack(pc, l.remote, false)
			return handedBack
		}
		if time.Since(start) > time.Millisecond {
			s.sending(pc) // it waited: in flight from now on
		}
		buf := budget.buffer(total)
		done := func() {
			budget.recycle(buf)
			budget.release(l.remote, held)
		}
		rctx, cancel := context.WithTimeout(pctx, s.f.opt.RequestTimeout)
		slice, ttfb, err := l.requestTimed(rctx, b.w.cid, b.w.size, pc.off, n, buf)
		cancel()
		s.f.n.prio.leave(s.f.opt.Priority)
		if err == nil {
			s.delivered(l.remote, n, ttfb) // a copy that lost its race was delivered too
		}
		if err == nil && !s.claim(pc) || err != nil && s.lostRace(pc) {
			done()
			return lostRace
		}
		if err != nil {
			done()
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
			return handedBack
		}
		buf = slice
		if h := s.f.opt.hooks; h != nil && h.verified != nil {
			h.verified(l.remote, b.w.cid, pc.off, n)
		}
		err = s.f.writeSlice(b.part, b.w.cid, pc.off, n, slice)
		done()
		if err != nil {
			var re *cas.RangeError
			if errors.As(err, &re) {
				s.f.n.punish(l.remote, re)
				s.handBack(pc, l.remote, true)
				return handedBack
			}
			s.handBack(pc, l.remote, false)
			s.fail(fmt.Errorf("swarm: write %s: %w", b.w.cid, err))
			return handedBack
		}
		s.f.success(l.remote)
		s.f.n.addPeerBytes(l.remote, n, 0)
		s.wroteBytes(pc, n)
	}
	return gotPiece
}
