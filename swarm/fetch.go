package swarm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
	"github.com/rdrr/peer/swarm/wire"
)

// ErrStalled: a fetch wrote no verified byte for FetchOptions.StallTimeout.
var ErrStalled = errors.New("swarm: fetch made no progress")

// Defaults of FetchOptions.
const (
	// DefaultMaxBlobSize bounds the size a peer may announce for the blob
	// a fetch starts from. Files become 64 MiB shards and a collection of
	// at most cas.MaxCollectionShards entries (under 100 MiB), so honest
	// roots are far below it; its outboard (1/256 of it) is what a liar
	// can make us allocate.
	DefaultMaxBlobSize = 1 << 30
	defaultOpenBlobs   = 16
	defaultMaxStrikes  = 3
	defaultStall       = 2 * time.Minute
	defaultFindTimeout = 30 * time.Second
	defaultMaxPeers    = 8
	// providerLookups is how many missing blobs a round looks up with
	// FetchOptions.Providers.
	providerLookups = 2
	// askGrace is how long a round waits for peers still connecting once
	// another has answered with something wanted.
	askGrace = 2 * time.Second
	// wantBatch is how many CIDs are asked under one RequestTimeout (the
	// link splits them further into WANTs whose HAVE fits a frame).
	wantBatch = 1024
)

// FetchOptions says where a fetch looks for a blob and how long it keeps
// trying. Zero values take the documented defaults.
type FetchOptions struct {
	// Peers to ask first (connected and discovered ones are asked too).
	Peers []peer.ID
	// Discover, if set, is called for more peers each round (for example:
	// the members of a signaling topic).
	Discover func(ctx context.Context) ([]peer.ID, error)
	// Providers, if set, is asked each round for peers that announced
	// the first blobs still missing (content routing: the DHT of an
	// overlay); they are asked right after the given Peers.
	Providers func(ctx context.Context, c cas.CID) ([]peer.ID, error)
	// FindTimeout bounds how long a fetch waits without progress for a
	// peer that has what is missing (default 30s). Without Discover, a
	// fetch whose given and connected peers were all dropped or banned
	// fails at once.
	FindTimeout time.Duration
	// MaxPeers bounds the peers asked in one round (default 8). Beyond the
	// given Peers they are chosen at random among those not asked yet, so
	// that peers which sort first in a topic cannot hide a blob; while
	// nobody asked has what is missing, each round asks others, until
	// every candidate was asked (then all may be asked again).
	MaxPeers int
	// MaxBlobSize bounds the size a peer may announce for a blob whose size
	// nothing verified says (the CID the fetch starts from; shards' sizes
	// come from their collection) (default DefaultMaxBlobSize). A claimed
	// size is proven by the blob's last group before anything is
	// allocated for it.
	MaxBlobSize int64
	// OpenBlobs bounds the blobs downloaded at once: each holds a file and
	// its outboard (1/256 of its size) in memory (default 16).
	OpenBlobs int
	// RequestTimeout bounds one request (default: the node's
	// Config.RequestTimeout).
	RequestTimeout time.Duration
	// MaxStrikes: a peer whose requests fail this many times in a row
	// (timeouts, short or malformed answers, refusals of what it
	// announced) gets no more requests in this fetch (default 3). Requests
	// that were in flight together count once, and a peer with a strike
	// gets one request at a time until one succeeds.
	MaxStrikes int
	// StallTimeout: the fetch fails with ErrStalled when it wrote no
	// verified byte for this long (default 2m), whatever peers promise.
	StallTimeout time.Duration
	// Priority of the fetch's requests among the node's (default
	// PriorityDemand): lower ones wait while higher ones are in flight.
	Priority Priority
	// Progress, if set, is called after each verified piece with the bytes
	// written so far and the bytes this round of the fetch has to get
	// (which shrinks as resumed blobs are opened). Calls come one at a
	// time from the fetch's goroutines; it must not block.
	Progress func(done, total int64)
	// Verified, if set, is given the data of each piece once it is
	// verified, before the store writes it: runs of whole 16 KiB groups of
	// blob (c or, for a collection, one of its shards; the blob's last
	// group may be short) at offset off in it. Calls come concurrently
	// from the fetch's goroutines; data is valid only during the call. A
	// group may come more than once (an endgame's copies), and groups the
	// store held before the fetch, or that it gets without the fetch's
	// scheduler, do not come at all. `peer get -o` writes a file with it
	// as it arrives, instead of reading it back from the store and
	// verifying it again. Only a store whose Partials have
	// WriteSliceFunc (a *cas.Store's) can hand the data over; with
	// another, Verified is not called.
	Verified func(blob cas.CID, off int64, data []byte)

	hooks *fetchHooks // tests only
}

// funcPartial is a Partial that hands what it verified to a function
// (*cas.Partial).
type funcPartial interface {
	WriteSliceFunc(off, n int64, slice []byte, fn func(off int64, data []byte)) error
}

// writeSlice writes the slice [off, off+n) of blob c into part, handing
// its data to opt.Verified on the way when part can.
func (f *fetcher) writeSlice(part Partial, c cas.CID, off, n int64, slice []byte) error {
	if f.opt.Verified != nil {
		inner := part
		if sp, ok := part.(*slotPartial); ok {
			inner = sp.Partial
		}
		if fp, ok := inner.(funcPartial); ok {
			return fp.WriteSliceFunc(off, n, slice, func(at int64, data []byte) { f.opt.Verified(c, at, data) })
		}
	}
	return part.WriteSlice(off, n, slice)
}

// fetchHooks let tests watch a fetch; nil outside tests.
type fetchHooks struct {
	// opened and closed are called, concurrently, when a Partial is
	// opened and when it is closed or finished.
	opened func(c cas.CID, size int64)
	closed func(c cas.CID)
	// requested is called before each REQUEST, from the fetch's
	// goroutines, concurrently.
	requested func(p peer.ID, c cas.CID, off, n int64)
	// verified is called when the answer to a REQUEST arrived and may be
	// written (it won its endgame race, if any), before it is written.
	verified func(p peer.ID, c cas.CID, off, n int64)
}

func (h *fetchHooks) request(p peer.ID, c cas.CID, off, n int64) {
	if h != nil && h.requested != nil {
		h.requested(p, c, off, n)
	}
}

func (o FetchOptions) withDefaults(cfg Config) FetchOptions {
	if o.FindTimeout <= 0 {
		o.FindTimeout = defaultFindTimeout
	}
	if o.MaxPeers <= 0 {
		o.MaxPeers = defaultMaxPeers
	}
	if o.MaxBlobSize <= 0 {
		o.MaxBlobSize = DefaultMaxBlobSize
	}
	if o.OpenBlobs <= 0 {
		o.OpenBlobs = defaultOpenBlobs
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = cfg.RequestTimeout
	}
	if o.MaxStrikes <= 0 {
		o.MaxStrikes = defaultMaxStrikes
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = defaultStall
	}
	return o
}

// FetchTo makes blob c present in st, and if c is a collection, every
// shard it lists too. Pieces come from whichever peers have them, each 16
// KiB group verified against its CID before it is written; a peer that
// sends a bad group is banned, one that stalls or answers badly is dropped
// from the fetch, and their pieces are fetched from others. An interrupted
// fetch resumes from the groups already verified in st. Fetch is FetchTo
// a *cas.Store.
func (n *Node) FetchTo(ctx context.Context, st Store, c cas.CID, opt FetchOptions) (cas.Info, error) {
	opt = opt.withDefaults(n.cfg)
	f := &fetcher{n: n, st: st, opt: opt, peers: map[peer.ID]*peerScore{}, early: map[peer.ID][]wire.HaveEntry{}}
	defer n.trackFetch(f)()
	f.touch()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := f.watchStall(ctx, c, cancel)
	defer stopWatch()

	info, err := f.fetchAll(ctx, c)
	if cause := context.Cause(ctx); err != nil && errors.Is(cause, ErrStalled) {
		return cas.Info{}, cause
	}
	return info, err
}

func (f *fetcher) fetchAll(ctx context.Context, c cas.CID) (cas.Info, error) {
	root := &want{cid: c, size: -1, resume: -1}
	if sizes, err := f.st.Partials(); err == nil {
		if s, ok := sizes[c.Raw()]; ok && s <= f.opt.MaxBlobSize {
			// A download in progress: its size was proven when it began
			// (it is proven again before it is used).
			root.resume = s
		}
	}
	if err := f.fetch(ctx, []*want{root}); err != nil {
		return cas.Info{}, err
	}
	info, err := f.st.Stat(c)
	if err != nil {
		return cas.Info{}, err
	}
	if !info.Collection {
		return info, nil
	}
	// The store recognizes a collection when it completes and links its
	// shards, so GC keeps them while the shards are fetched. The shards'
	// sizes come from the collection, which was verified against c.
	col, err := f.st.Collection(c)
	if err != nil {
		return cas.Info{}, err
	}
	var missing []*want
	listed := make(map[cas.CID]bool, len(col.Shards))
	for _, sh := range col.Shards {
		if listed[sh.CID] {
			continue // a file with a repeated 64 MiB region
		}
		listed[sh.CID] = true
		if inf, err := f.st.Stat(sh.CID); err != nil || inf.Corrupt {
			missing = append(missing, &want{cid: sh.CID, size: sh.Size})
		}
	}
	if err := f.fetch(ctx, missing); err != nil {
		return cas.Info{}, err
	}
	return info, nil
}

// watchStall cancels ctx with ErrStalled when no verified byte was written
// for StallTimeout. The returned func stops the watch.
func (f *fetcher) watchStall(ctx context.Context, c cas.CID, cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(min(f.opt.StallTimeout/4, time.Second))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if idle := f.n.cfg.Now().Sub(time.Unix(0, f.lastProgress.Load())); idle > f.opt.StallTimeout {
					cancel(fmt.Errorf("swarm: fetch %s: %w: no verified data for %v (%s)", c, ErrStalled, idle.Round(time.Millisecond), f.dropSummary()))
					return
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// want is a blob to fetch.
type want struct {
	cid  cas.CID
	size int64 // -1: unknown until a peer's claim is proven
	// resume is the size of a download of cid in progress, or -1.
	resume int64
	// proof is the verified slice of the last group that proved size,
	// written once the blob is opened.
	proof []byte
	// part is the blob's download, kept open between the rounds of a
	// fetch (nil while a round's scheduler has it, or when closed): what
	// it announced it keeps serving (PROTOCOL.md, HAVE). The fetch
	// closes it when it ends (release).
	part Partial
}

// fetcher is one Fetch: the peers' scores last for all of it.
type fetcher struct {
	n   *Node
	st  Store
	opt FetchOptions

	lastProgress atomic.Int64 // unix nanos of the last verified write

	mu      sync.Mutex
	peers   map[peer.ID]*peerScore
	sched   *scheduler // the round's, while it runs
	running bool       // sched's workers are counted: announcements go to it
	// early keeps each peer's latest announcement (at most maxEarly peers
	// of at most maxEarlyEntries entries) for the next round to start
	// from: pieces announced while a round is being set up are not lost.
	early map[peer.ID][]wire.HaveEntry
}

// Bounds of fetcher.early.
const (
	maxEarly        = 64
	maxEarlyEntries = 64
)

// peerHas takes p's announcement (copied entries).
func (f *fetcher) peerHas(p peer.ID, entries []wire.HaveEntry) {
	f.mu.Lock()
	if _, ok := f.early[p]; ok || len(f.early) < maxEarly {
		f.early[p] = entries[:min(len(entries), maxEarlyEntries)]
	}
	s, running := f.sched, f.running
	f.mu.Unlock()
	if s != nil && running {
		s.peerHas(p, entries)
	}
}

// touch records progress (verified bytes written) for the stall deadline.
func (f *fetcher) touch() { f.lastProgress.Store(f.n.cfg.Now().UnixNano()) }

// fetch gets every wanted blob, looking for providers again (and waiting
// up to FindTimeout without progress) while some are missing.
func (f *fetcher) fetch(ctx context.Context, wants []*want) error {
	defer f.release(slices.Clone(wants))
	// Who was asked is about other blobs (a collection, before its
	// shards): everyone may be asked for these.
	f.mu.Lock()
	for _, ps := range f.peers {
		ps.asked = false
	}
	f.mu.Unlock()
	idle := time.Now()
	for {
		wants = slices.DeleteFunc(wants, func(w *want) bool {
			inf, err := f.st.Stat(w.cid)
			return err == nil && !inf.Corrupt
		})
		if len(wants) == 0 {
			return nil
		}
		r, err := f.round(ctx, wants)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		if r.progressed {
			idle = time.Now()
			continue
		}
		if time.Since(idle) > f.opt.FindTimeout || r.asked == 0 && f.opt.Discover == nil {
			// Out of time, or out of peers: every one given or connected
			// was dropped or banned, and none can be discovered.
			return fmt.Errorf("swarm: fetch %s (and %d more): %w (%s)", wants[0].cid, len(wants)-1, ErrNoProviders, f.dropSummary())
		}
		if r.found || r.fresh == 0 {
			// Someone had something (and failed), or every candidate was
			// asked: give them a moment before asking everyone again.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
		// Otherwise nobody asked had anything: widen the search at once.
	}
}

// release closes the downloads of wants kept open between rounds.
func (f *fetcher) release(wants []*want) {
	for _, w := range wants {
		f.closePart(w)
	}
}

// closePart closes w's download kept open between rounds, if any, and
// retracts the pieces it announced (Node.retract).
func (f *fetcher) closePart(w *want) {
	if w.part == nil {
		return
	}
	w.part.Close()
	w.part = nil
	if h := f.opt.hooks; h != nil && h.closed != nil {
		h.closed(w.cid)
	}
	f.n.retract(w.cid, w.size)
}

// candidates returns the peers to ask this round: the given ones not asked
// yet, then others not asked yet, at random, up to MaxPeers. fresh is how
// many were never asked before; when none is left, everyone becomes
// eligible again.
func (f *fetcher) candidates(ctx context.Context, wants []*want) (out []peer.ID, fresh int) {
	given := slices.Clone(f.opt.Peers)
	if f.opt.Providers != nil {
		// The first few missing blobs: shards of one collection are
		// mostly held by the same peers.
		for _, w := range wants[:min(len(wants), providerLookups)] {
			ps, err := f.opt.Providers(ctx, w.cid)
			if err != nil {
				f.n.log.Debug("swarm: fetch: providers", "cid", w.cid, "err", err)
			}
			given = append(given, ps...)
		}
	}
	others := f.n.Peers()
	if f.opt.Discover != nil {
		if more, err := f.opt.Discover(ctx); err == nil {
			others = append(others, more...)
		} else {
			f.n.log.Debug("swarm: fetch: discover", "err", err)
		}
	}
	rand.Shuffle(len(others), func(i, j int) { others[i], others[j] = others[j], others[i] })
	all := append(given, others...)
	seen := map[peer.ID]bool{f.n.ID(): true}
	eligible := all[:0]
	for _, p := range all {
		if !seen[p] && !f.n.Banned(p) && !f.dropped(p) {
			seen[p] = true
			eligible = append(eligible, p)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	pick := func() {
		for _, p := range eligible {
			if len(out) == f.opt.MaxPeers {
				return
			}
			if ps := f.peers[p]; ps == nil || !ps.asked {
				out = append(out, p)
			}
		}
	}
	pick()
	fresh = len(out)
	if len(out) == 0 {
		for _, ps := range f.peers {
			ps.asked = false
		}
		pick()
	}
	for _, p := range out {
		f.score(p).asked = true
	}
	return out, fresh
}

type roundResult struct {
	progressed bool // verified bytes were written
	found      bool // someone had something wanted
	fresh      int  // peers asked for the first time
	asked      int  // peers asked
}

// answer is what one peer said in the ask phase.
type answer struct {
	p     peer.ID
	links []*link
	have  []wire.HaveEntry
}

// round asks the candidates who has what, proves unknown sizes, and runs
// one scheduler over everything someone has.
func (f *fetcher) round(ctx context.Context, wants []*want) (roundResult, error) {
	peers, fresh := f.candidates(ctx, wants)
	res := roundResult{fresh: fresh, asked: len(peers)}
	answers := f.ask(ctx, peers, wants)

	// Who has what. Every number in a HAVE is the peer's word: a size must
	// be the one the collection gave (shards) or at most MaxBlobSize and
	// proven by the last group (the root), or the entry is not used.
	byCID := make(map[cas.CID]*want, len(wants))
	for _, w := range wants {
		byCID[w.cid.Raw()] = w // HAVE entries carry digests: raw CIDs
	}
	claims := map[*want]map[int64][]peer.ID{}
	// Blobs held in part: used once the size is known, never to prove it.
	parts := map[*want]map[peer.ID]wire.HaveEntry{}
	for _, a := range answers {
		seen := map[cas.CID]bool{}
		for _, e := range a.have {
			w := byCID[e.CID]
			if w == nil || seen[e.CID] {
				continue // not asked (the link refuses those), or repeated
			}
			seen[e.CID] = true
			if e.Bitmap != nil {
				if parts[w] == nil {
					parts[w] = map[peer.ID]wire.HaveEntry{}
				}
				parts[w][a.p] = e
				continue
			}
			switch {
			case w.size >= 0 && e.Size != uint64(w.size):
				f.liar(a.p, e.CID, fmt.Sprintf("announced %d bytes for %s; its collection says %d", e.Size, e.CID, w.size))
				continue
			case e.Size > 1<<62:
				// Past any size a store can hold (and past int64).
				f.liar(a.p, e.CID, fmt.Sprintf("announced %d bytes for %s", e.Size, e.CID))
				continue
			}
			if claims[w] == nil {
				claims[w] = map[int64][]peer.ID{}
			}
			claims[w][int64(e.Size)] = append(claims[w][int64(e.Size)], a.p)
		}
	}
	linksOf := map[peer.ID][]*link{}
	for _, a := range answers {
		linksOf[a.p] = a.links
	}
	s := newScheduler(f, int64(f.n.cfg.PieceSize), f.opt.OpenBlobs)
	// Downloads kept open from the last round are opened first: with the
	// others they stay within OpenBlobs.
	order := slices.Clone(wants)
	slices.SortStableFunc(order, func(a, b *want) int {
		switch {
		case a.part != nil && b.part == nil:
			return -1
		case a.part == nil && b.part != nil:
			return 1
		}
		return 0
	})
	for _, w := range order {
		cl := claims[w]
		if len(cl) == 0 && (w.size < 0 || len(parts[w]) == 0) {
			f.closePart(w) // nobody has it this round
			continue
		}
		if w.size < 0 {
			f.proveSize(ctx, w, cl, linksOf)
			if w.size < 0 {
				continue
			}
		}
		var provs []peer.ID
		for _, p := range cl[w.size] {
			if !f.n.Banned(p) && !f.dropped(p) {
				provs = append(provs, p)
			}
		}
		bits := map[peer.ID][]byte{}
		for p, e := range parts[w] {
			switch {
			case e.Size != uint64(w.size):
				f.liar(p, e.CID, fmt.Sprintf("announced %d bytes for %s; verified data says %d", e.Size, e.CID, w.size))
			case !f.n.Banned(p) && !f.dropped(p) && countUnits(e.Bitmap) > 0:
				provs = append(provs, p)
				bits[p] = e.Bitmap
			}
		}
		if len(provs) > 0 {
			s.add(w, provs, bits)
			res.found = true
		} else {
			f.closePart(w)
		}
	}
	for _, a := range answers {
		switch {
		case s.hasPeer(a.p):
			s.addLinks(a.p, a.links)
			// A provider stays eligible for the next round.
			f.mu.Lock()
			f.score(a.p).asked = false
			f.mu.Unlock()
		case res.found && len(a.links) > 0 && a.links[0].peerHello().Caps&wire.CapPartial != 0 && !f.n.Banned(a.p) && !f.dropped(a.p):
			// Nothing yet, but it announces pieces as it gets them (a
			// peer fetching the same blobs): its workers wait for them,
			// and the next round asks it again.
			s.addWatcher(a.p, a.links)
			f.mu.Lock()
			f.score(a.p).asked = false
			f.mu.Unlock()
		}
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	wrote, err := s.run(ctx)
	res.progressed = wrote
	return res, err
}

// ask connects to each peer (one connection, more if it has something:
// widen) and asks which of wants it has, all peers at once.
func (f *fetcher) ask(ctx context.Context, peers []peer.ID, wants []*want) []answer {
	cids := make([]cas.CID, len(wants))
	for j, w := range wants {
		cids[j] = w.cid
	}
	answers := make([]answer, len(peers))
	// Once someone has something, peers still connecting (a dead peer
	// the overlay or a topic still lists holds a setup for the whole
	// ConnectTimeout) get askGrace more; then the round goes on without
	// them, and a later round asks them again.
	actx, stop := context.WithCancel(ctx)
	defer stop()
	found := make(chan struct{})
	var foundOnce sync.Once
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := actx
			ls, err := f.n.connectN(ctx, p, 1)
			if err != nil {
				f.n.log.Debug("swarm: fetch: connect", "peer", p, "err", err)
				return
			}
			var have []wire.HaveEntry
			for rest := cids; len(rest) > 0; {
				batch := rest[:min(len(rest), wantBatch)]
				rest = rest[len(batch):]
				start := time.Now()
				rctx, cancel := context.WithTimeout(ctx, f.opt.RequestTimeout)
				h, err := ls[0].want(rctx, batch)
				cancel()
				if err != nil {
					f.n.log.Debug("swarm: fetch: want", "peer", p, "err", err)
					if strike, _ := judge(err); strike && ctx.Err() == nil {
						f.strike(p, start, fmt.Errorf("swarm: WANT to %s: %w", p, err))
					}
					return
				}
				have = append(have, h...)
			}
			if len(have) > 0 {
				foundOnce.Do(func() { close(found) })
				f.widen(p)
			}
			answers[i] = answer{p: p, links: ls, have: have}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-found:
		select {
		case <-done:
		case <-time.After(askGrace):
			f.n.stats.askCuts.Add(1)
			stop()
			<-done
		}
	}
	return slices.DeleteFunc(answers, func(a answer) bool { return a.links == nil })
}

// widen opens the rest of the node's Links connections to p, which has
// something wanted, in the background: the round starts on the
// connection p was asked over, and each further one joins it as it comes
// up (linkUp), instead of the round waiting for all of them. A
// connection's setup is several round trips (ICE, DTLS, the HELLOs): on
// a long path, most of the time a fetch of some MiB took
// (swarm/BENCHMARKS.md, "round trips"). The dials are the node's, as
// Connect's are: a connection that comes up after the fetch ended serves
// later ones.
func (f *fetcher) widen(p peer.ID) {
	n := f.n
	n.mu.Lock()
	need := n.cfg.Links - len(n.links[p]) - n.dialing[p]
	if n.closed || need <= 0 {
		n.mu.Unlock()
		return
	}
	n.dialing[p] += need
	n.wg.Add(need)
	n.mu.Unlock()
	for range need {
		go func() {
			defer n.wg.Done()
			l, err := n.dial(n.ctx, p)
			n.mu.Lock()
			if n.dialing[p]--; n.dialing[p] <= 0 {
				delete(n.dialing, p)
			}
			n.mu.Unlock()
			if err != nil {
				n.log.Debug("swarm: fetch: connect", "peer", p, "err", err)
				return
			}
			f.linkUp(l)
		}()
	}
}

// linkUp hands l, a connection widen opened, to the round that runs or is
// being set up, if any (scheduler.join).
func (f *fetcher) linkUp(l *link) {
	f.mu.Lock()
	s := f.sched
	f.mu.Unlock()
	if s != nil {
		s.join(l)
	}
}

// proveSize finds which claimed size of w is true: for each claim, most
// claimants first, it asks a claimant for the blob's last group at that
// size and verifies it against the CID. The last group's chunk counter and
// length, and the tree nodes above it, commit to the size, so only the
// true size verifies; claimants of any other size are banned. Nothing is
// allocated from a claim but that one group's slice.
func (f *fetcher) proveSize(ctx context.Context, w *want, claims map[int64][]peer.ID, links map[peer.ID][]*link) {
	sizes := make([]int64, 0, len(claims))
	for sz := range claims {
		sizes = append(sizes, sz)
	}
	slices.SortFunc(sizes, func(a, b int64) int {
		switch {
		case a == w.resume: // a download in progress first
			return -1
		case b == w.resume:
			return 1
		case len(claims[a]) != len(claims[b]):
			return len(claims[b]) - len(claims[a])
		case a < b:
			return -1
		case a > b:
			return 1
		}
		return 0
	})
	for _, sz := range sizes {
		if sz > f.opt.MaxBlobSize {
			// Nothing is allocated for a size past the limit, not even a
			// probe: it is not believed unless another size is proven.
			for _, p := range claims[sz] {
				f.strike(p, time.Time{}, fmt.Errorf("swarm: peer %s announced %d bytes for %s, over the limit of %d", p, sz, w.cid, f.opt.MaxBlobSize))
			}
			continue
		}
		for _, p := range claims[sz] {
			if ctx.Err() != nil {
				return
			}
			if f.n.Banned(p) || f.dropped(p) || len(links[p]) == 0 {
				continue
			}
			if f.probe(ctx, w, sz, p, links[p][0]) {
				w.size = sz
				for other, ps := range claims {
					if other == sz {
						continue
					}
					for _, q := range ps {
						f.liar(q, w.cid, fmt.Sprintf("announced %d bytes for %s; its last group proves %d", other, w.cid, sz))
					}
				}
				return
			}
		}
	}
}

// probe asks p for the last group of w.cid as if it had size bytes and
// reports whether the slice verified. A slice that fails bans p.
func (f *fetcher) probe(ctx context.Context, w *want, size int64, p peer.ID, l *link) bool {
	if size == 0 {
		if w.cid.Digest() == cas.Sum(nil).Digest() {
			return true
		}
		f.liar(p, w.cid, fmt.Sprintf("announced %s as empty; it is not the empty blob", w.cid))
		return false
	}
	off := (bao.Groups(size) - 1) * bao.GroupSize
	n := size - off
	start := time.Now()
	if err := f.n.fetchPace.wait(ctx, f.opt.Priority, cas.SliceLen(size, off, n)); err != nil {
		return false
	}
	held, err := f.n.admit(ctx, f.opt.Priority, p, cas.SliceLen(size, off, n), func() {
		f.opt.hooks.request(p, w.cid, off, n)
	})
	if err != nil {
		return false
	}
	defer f.n.fetching.release(p, held)
	rctx, cancel := context.WithTimeout(ctx, f.opt.RequestTimeout)
	slice, err := l.request(rctx, w.cid, size, off, n, nil)
	cancel()
	f.n.prio.leave(f.opt.Priority)
	if err != nil {
		if ctx.Err() == nil {
			f.requestFailed(p, start, w.cid, err)
		}
		return false
	}
	var dst, scratch [bao.GroupSize]byte
	if err := bao.DecodeSlice(dst[:], slice, w.cid.Digest(), size, off, n, &scratch); err != nil {
		re := &cas.RangeError{CID: w.cid, Off: off, Len: n, Reason: "size proof: " + err.Error()}
		var be *bao.Error
		if errors.As(err, &be) {
			re.Off, re.Len, re.Reason = be.Off, be.Len, "size proof: "+be.Reason
		}
		f.n.punish(p, re)
		return false
	}
	w.proof = slice
	f.n.addPeerBytes(p, n, 0)
	f.success(p)
	return true
}

// liar bans p for a claim that verified data contradicts.
func (f *fetcher) liar(p peer.ID, c cas.CID, detail string) {
	f.n.log.Warn("swarm: fetch: peer lied", "peer", p, "cid", c, "detail", detail)
	f.n.ban(p, Event{Peer: p, Kind: EventProtocol, CID: c, Detail: "peer " + p.String() + " " + detail})
}

// requestFailed scores a failed request to p (started at start) for blob
// c. It reports whether p is believed to no longer have c.
func (f *fetcher) requestFailed(p peer.ID, start time.Time, c cas.CID, err error) (lost bool) {
	var rej *RejectError
	if errors.As(err, &rej) && rej.Req != 0 && rej.Code == wire.CodeNotFound {
		f.broke(p, start, c, err)
		return true
	}
	strike, lost := judge(err)
	if strike {
		f.strike(p, start, fmt.Errorf("swarm: %s of %s: %w", p, c, err))
	}
	return lost
}

// broke scores p's refusal (not_found) of a request for blob c started
// at start. Every REQUEST goes to a peer for a range it said it holds (a
// whole blob, or pieces of its HAVE bitmap), and an honest peer serves
// what it announced until it retracts it (Node.retract), so a refusal is
// a broken promise: a strike in this fetch (refusals of requests in
// flight together count once), and, once per blob and fetch, a protocol
// violation for the node, which bans a peer at its third within an hour
// (a peer that lies in HAVE about three blobs; one that deleted a blob,
// or whose retraction crossed our request, costs one).
func (f *fetcher) broke(p peer.ID, start time.Time, c cas.CID, err error) {
	f.mu.Lock()
	ps := f.score(p)
	_, again := ps.refused[c.Raw()]
	if !again && len(ps.refused) < maxRefused {
		if ps.refused == nil {
			ps.refused = map[cas.CID]struct{}{}
		}
		ps.refused[c.Raw()] = struct{}{}
	}
	f.mu.Unlock()
	f.strike(p, start, fmt.Errorf("swarm: %s refused %s, which it announced: %w", p, c, err))
	if !again {
		f.n.log.Info("swarm: fetch: peer refused what it announced", "peer", p, "cid", c, "err", err)
		f.n.strike(p, fmt.Sprintf("refused a range of %s that it announced (%v)", c, err))
	}
}

// maxRefused bounds the blobs remembered per peer as refused (broke).
const maxRefused = 1024

// judge says what a failed request (or WANT) tells of the peer: strike,
// that it stalled or misbehaved; lost, that it no longer has the blob.
// See errors.go for what link requests fail with.
func judge(err error) (strike, lost bool) {
	var rej *RejectError
	switch {
	case errors.As(err, &rej) && rej.Req != 0:
		switch rej.Code {
		case wire.CodeBusy:
			return false, false
		case wire.CodeNotFound, wire.CodeCorrupt, wire.CodeShuttingDown:
			// (A REQUEST refused not_found is a broken promise:
			// requestFailed.)
			// It may have lost or be leaving it: honest, but no provider.
			return false, true
		}
		// bad_request for a range inside a blob whose size was proven,
		// or internal: it refuses what it announced.
		return true, true
	case errors.Is(err, ErrProtocol), errors.Is(err, ErrRequestTimeout), errors.Is(err, context.DeadlineExceeded):
		// Timed out (ours: context.DeadlineExceeded, or the link's), or
		// a short or malformed answer that closed the link.
		return true, false
	case errors.Is(err, ErrLinkClosed), errors.Is(err, ErrBanned), errors.Is(err, context.Canceled):
		return false, false // the link's own fate; its workers stop
	}
	return true, false
}
