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

// Serving: a REQUEST is answered as a stream of chunks of at most
// serveChunk bytes of blob data, each read (verified) from the Source into
// a buffer that the serving budget pays for, cut into PIECEs in place and
// handed to SCTP. The budget is paid back as the peer's SCTP acknowledges
// the bytes, so a peer that stops reading holds at most its share of the
// budget, however many connections, channels and requests it opens.
const (
	// serveChunk is the blob data read per chunk: 16 groups.
	serveChunk = 16 * cas.GroupSize
	// serveChunkBuf fits any chunk's slice bytes: the size, the data and
	// the parents above it (at most two per tree level), plus a PIECE
	// header in front.
	serveChunkBuf = wire.PieceHeaderSize + 8 + serveChunk + 64*2*64
	// minServeBudget lets every peer's share hold a chunk.
	minServeBudget = 2 << 20
	// servePeerShare: one peer holds at most 1/servePeerShare of the
	// budget, so a peer that never reads cannot starve the others.
	servePeerShare = 4
	// settlePoll is how often an idle serve worker looks whether SCTP
	// has delivered the bytes it still pays for.
	settlePoll = 20 * time.Millisecond
)

// serveBudget bounds the bytes held for serving (Config.ServeBudget): in
// read buffers and in SCTP send queues. Safe for concurrent use.
type serveBudget struct {
	total, perPeer int64

	mu     sync.Mutex
	used   int64
	peak   int64 // the most used at once (tests read it)
	byPeer map[peer.ID]int64
	freed  chan struct{} // closed and replaced when bytes are released
}

func newServeBudget(total int) *serveBudget {
	return &serveBudget{
		total:   int64(total),
		perPeer: int64(total / servePeerShare),
		byPeer:  make(map[peer.ID]int64),
		freed:   make(chan struct{}),
	}
}

// acquire takes n bytes for p, waiting (within ctx) until they fit both
// the total and p's share. While it waits it calls settle every
// settlePoll: the bytes the caller's own channel still pays for may be
// what is in the way.
func (b *serveBudget) acquire(ctx context.Context, p peer.ID, n int64, settle func()) error {
	var poll *time.Timer
	for {
		settle()
		b.mu.Lock()
		if b.used+n <= b.total && b.byPeer[p]+n <= b.perPeer {
			b.used += n
			b.byPeer[p] += n
			b.peak = max(b.peak, b.used)
			b.mu.Unlock()
			return nil
		}
		freed := b.freed
		b.mu.Unlock()
		if poll == nil {
			poll = time.NewTimer(settlePoll)
			defer poll.Stop()
		} else {
			poll.Reset(settlePoll)
		}
		select {
		case <-freed:
		case <-poll.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// release gives back n bytes that p held.
func (b *serveBudget) release(p peer.ID, n int64) {
	if n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.byPeer[p] -= n; b.byPeer[p] <= 0 {
		delete(b.byPeer, p)
	}
	close(b.freed)
	b.freed = make(chan struct{})
}

// held returns the bytes held now, in all and by p.
func (b *serveBudget) held(p peer.ID) (all, byPeer int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.byPeer[p]
}

// charge makes ch pay n budget bytes, now in a read buffer (hold) and
// later in its SCTP send queue.
func (ch *channel) charge(n int64) {
	ch.mu.Lock()
	ch.charged += n
	ch.holding += n
	ch.mu.Unlock()
}

// unhold says the read buffer of n bytes is dropped; its bytes are now in
// the SCTP queue (or delivered).
func (ch *channel) unhold(n int64) {
	ch.mu.Lock()
	ch.holding -= n
	ch.mu.Unlock()
}

// settle pays back what SCTP has delivered: the channel keeps paying for
// its read buffer and its queued bytes only. It returns what it still
// pays for.
func (ch *channel) settle() int64 {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	keep := min(ch.charged, ch.holding+int64(ch.dc.BufferedAmount()))
	ch.l.n.budget.release(ch.l.remote, ch.charged-keep)
	ch.charged = keep
	return keep
}

// settleAll pays back everything (the link closed: SCTP's queue is gone).
func (ch *channel) settleAll() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.l.n.budget.release(ch.l.remote, ch.charged)
	ch.charged, ch.holding = 0, 0
}

// pacer spreads bytes over time at a rate: serving (Config.ServeRate),
// and the requests of fetches (Config.FetchRate). Each transfer reserves
// its transmission time after the ones before it of its own or a higher
// priority, and pushes back the later reservations of lower priorities:
// a demand request is not queued behind the background requests that
// reserved their turn before it. A reservation is made at most
// paceAhead before its time (a transfer due later waits unreserved
// first), so those that a higher priority overtakes are at most
// paceAhead's worth of bytes a priority (plus one transfer): the rate
// passes the cap by that much at most, and over a longer time it holds;
// and a queue of waiting transfers holds no turns that a cancelled one
// would leave unused (a cancelled wait gives its turn back, and those
// waiting to reserve look again). Safe for concurrent use; a nil pacer
// never waits.
type pacer struct {
	rate float64 // bytes a second
	mu   sync.Mutex
	next [numPriorities]time.Time // the end of each priority's reservations
	// back is closed (and replaced) when a turn is given back: the
	// transfers waiting to reserve look again.
	back chan struct{}
}

// paceAhead is how long before its turn a transfer reserves it.
const paceAhead = time.Second

func newPacer(rate int64) *pacer {
	if rate <= 0 {
		return nil
	}
	return &pacer{rate: float64(rate), back: make(chan struct{})}
}

// wait returns when n more bytes of priority prio may be sent, or with
// ctx's error.
func (p *pacer) wait(ctx context.Context, prio Priority, n int64) error {
	if p == nil {
		return nil
	}
	prio = prio.clamp()
	d := time.Duration(float64(n) / p.rate * float64(time.Second))
	var at time.Time
	for {
		p.mu.Lock()
		now := time.Now()
		at = maxTime(p.next[prio], now)
		if ahead := at.Sub(now); ahead > paceAhead {
			back := p.back
			p.mu.Unlock()
			t := time.NewTimer(ahead - paceAhead)
			select {
			case <-t.C:
			case <-back:
				t.Stop()
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			continue
		}
		// What each queue is pushed back by, to give back exactly.
		var raised [numPriorities]time.Duration
		for q := prio; q < numPriorities; q++ {
			end := maxTime(p.next[q], at).Add(d)
			raised[q] = end.Sub(p.next[q])
			p.next[q] = end
		}
		p.mu.Unlock()
		if err := sleepCtx(ctx, time.Until(at)); err != nil {
			// Give the turn back: the bytes are not sent.
			p.mu.Lock()
			for q := prio; q < numPriorities; q++ {
				p.next[q] = p.next[q].Add(-raised[q])
			}
			close(p.back)
			p.back = make(chan struct{})
			p.mu.Unlock()
			return err
		}
		return nil
	}
}

// sleepCtx waits d, or returns ctx's error if it ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// uncheckedSource returns the node's Source as an UncheckedSource, if it
// is one and Config.VerifyServed is off.
func (n *Node) uncheckedSource() (UncheckedSource, bool) {
	if n.cfg.VerifyServed {
		return nil, false
	}
	us, ok := n.cfg.Source.(UncheckedSource)
	return us, ok
}

// servedMemory is how many requests a link remembers having served, for
// checking them when the peer says one failed verification: more than a
// fetcher keeps in flight on one connection (Config.Window, 4), so the one
// it refused is among them.
const servedMemory = 16

// servedRange is a request a link served (or began serving).
type servedRange struct {
	cid    cas.CID
	off, n int64
}

// remember records that job is being served.
func (l *link) remember(job serveJob) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.served[l.servedNext%servedMemory] = servedRange{job.cid, job.off, job.n}
	l.servedNext++
}

// checkServed checks, as stored, what the link served lately (unchecked:
// UncheckedSource): the peer refused a slice of ours (REJECT bad_data),
// so our copy may have changed on disk since it was verified. What fails
// is no longer served (the Source marks it), and is logged. The checks
// run one at a time per node, in the background.
func (l *link) checkServed() {
	us, ok := l.n.uncheckedSource()
	if !ok {
		return // what we served was hashed as it was read
	}
	l.mu.Lock()
	var todo []servedRange
	for i := range min(l.servedNext, servedMemory) {
		if r := l.served[i]; !slices.Contains(todo, r) {
			todo = append(todo, r)
		}
	}
	l.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	l.n.wg.Add(1)
	go func() {
		defer l.n.wg.Done()
		select {
		case l.n.checkSem <- struct{}{}:
		case <-l.n.ctx.Done():
			return
		}
		defer func() { <-l.n.checkSem }()
		for _, r := range todo {
			if l.n.ctx.Err() != nil {
				return
			}
			err := us.CheckRange(r.cid, r.off, r.n)
			if errors.Is(err, cas.ErrCorrupt) {
				l.n.stats.corruptServed.Add(1)
				l.n.log.Error("swarm: a peer refused what we served, and our copy is corrupt: no longer served",
					"peer", l.remote, "cid", r.cid, "off", r.off, "len", r.n, "err", err)
			}
			if h := l.n.cfg.testHooks.checked; h != nil {
				h(r.cid, r.off, r.n, err)
			}
		}
	}()
}

// serveJob is a REQUEST from the peer, accepted and queued.
type serveJob struct {
	req          uint32
	cid          cas.CID
	size, off, n int64
	partial      bool // from a download in progress (PartialSource)
}

// serveWant answers WANT with the blobs we hold whole, in one HAVE: the
// requester keeps its WANTs small enough for the answer to fit its
// max_frame (wire.WantLimit).
func (l *link) serveWant(f *wire.Frame) error {
	if limit := wire.WantLimit(wire.MaxFrame, int(l.peerHello().MaxFrame)); len(f.Want) > limit {
		return l.reject(f.Req, wire.CodeBadRequest, fmt.Sprintf("WANT of %d CIDs; your max_frame allows an answer for %d", len(f.Want), limit))
	}
	var have, partial []wire.HaveEntry
	if src := l.n.cfg.Source; src != nil {
		seen := make(map[cas.CID]bool, len(f.Want))
		for _, c := range f.Want {
			if seen[c] {
				continue // listed once
			}
			seen[c] = true
			if inf, err := src.Stat(c); err == nil && !inf.Corrupt {
				have = append(have, wire.HaveEntry{CID: c, Size: uint64(inf.Size)})
			} else if l.peerHello().Caps&wire.CapPartial != 0 {
				if e, ok := l.n.partialEntry(c); ok {
					partial = append(partial, e)
				}
			}
		}
	}
	// Pieces of downloads in progress, to a peer that takes them, as many
	// as fit its frame after the whole blobs (which always fit).
	room := int(min(l.peerHello().MaxFrame, wire.MaxFrame)) - wire.HaveLen(have)
	for _, e := range partial {
		if k := wire.HaveLen([]wire.HaveEntry{e}) - wire.HaveLen(nil); k <= room {
			have = append(have, e)
			room -= k
		}
	}
	return l.ctl.write(l.ctx, wire.AppendHave(nil, f.Req, have))
}

func (l *link) reject(req uint32, code wire.Code, reason string) error {
	return l.ctl.write(l.ctx, wire.AppendReject(nil, req, code, reason))
}

// serveRequest checks a REQUEST and queues it for a serve worker.
func (l *link) serveRequest(f *wire.Frame) error {
	src := l.n.cfg.Source
	if src == nil {
		return l.reject(f.Req, wire.CodeNotFound, "this peer serves nothing")
	}
	inf, err := src.Stat(f.CID)
	partial := false
	switch {
	case err != nil:
		// Perhaps a download in progress has the range verified.
		size, ok := l.n.servablePartial(f.CID, f.Off, uint64(f.Len))
		if ok {
			inf, partial = cas.Info{Size: size}, true
			break
		}
		// Or it finished since Stat: a refusal of what was announced
		// counts against us (fetch.go, broke).
		if inf, err = src.Stat(f.CID); err != nil {
			return l.reject(f.Req, wire.CodeNotFound, "blob "+f.CID.String()+" (that range) not stored here")
		}
		if inf.Corrupt {
			return l.reject(f.Req, wire.CodeCorrupt, "our copy of "+f.CID.String()+" is corrupt")
		}
	case inf.Corrupt:
		return l.reject(f.Req, wire.CodeCorrupt, "our copy of "+f.CID.String()+" is corrupt")
	}
	size := inf.Size
	switch {
	case f.Len == 0 || f.Len > l.myHello().MaxRequest:
		return l.reject(f.Req, wire.CodeBadRequest, fmt.Sprintf("length %d; this peer serves 1..%d", f.Len, l.myHello().MaxRequest))
	case f.Off%cas.GroupSize != 0 || f.Off >= uint64(size) || uint64(f.Len) > uint64(size)-f.Off:
		return l.reject(f.Req, wire.CodeBadRequest, fmt.Sprintf("range [%d, %d) is unaligned or outside a %d-byte blob", f.Off, f.Off+uint64(f.Len), size))
	case f.Len%cas.GroupSize != 0 && f.Off+uint64(f.Len) != uint64(size):
		return l.reject(f.Req, wire.CodeBadRequest, fmt.Sprintf("length %d is not a multiple of %d and does not end the blob", f.Len, cas.GroupSize))
	}
	l.mu.Lock()
	if _, dup := l.serving[f.Req]; dup {
		l.mu.Unlock()
		return protoErr(l.remote, "request id %d reused while outstanding", f.Req)
	}
	select {
	case l.serveQ <- serveJob{req: f.Req, cid: f.CID, size: size, off: int64(f.Off), n: int64(f.Len), partial: partial}:
		l.serving[f.Req] = false
		l.mu.Unlock()
		return nil
	default:
		l.mu.Unlock()
		return l.reject(f.Req, wire.CodeBusy, fmt.Sprintf("more than %d requests outstanding", l.n.cfg.MaxOutstanding))
	}
}

func (l *link) cancelled(req uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.serving[req]
}

// serveLoop answers queued REQUESTs, sending each slice as PIECEs on ch,
// and pays back the serving budget as SCTP delivers.
func (l *link) serveLoop(ch *channel) {
	defer l.wg.Done()
	defer ch.settleAll()
	poll := time.NewTimer(settlePoll)
	defer poll.Stop()
	for {
		var wake <-chan time.Time
		if ch.settle() > 0 {
			poll.Reset(settlePoll)
			wake = poll.C
		}
		select {
		case job := <-l.serveQ:
			serve := l.serveOne
			if h := l.n.cfg.testHooks.serve; h != nil {
				serve = func(ch *channel, job serveJob) error { return h(l, ch, job) }
			}
			err := serve(ch, job)
			l.mu.Lock()
			delete(l.serving, job.req)
			l.mu.Unlock()
			if err != nil {
				l.close(err)
				return
			}
		case <-wake:
		case <-l.done:
			return
		}
	}
}

var serveBufs = sync.Pool{New: func() any { b := make([]byte, 0, serveChunkBuf); return &b }}

// serveOne sends the slice of job as PIECEs, one budgeted chunk at a time
// (chunkAt). A failure to read, or no room in the budget, stops the answer
// with REJECT, even after some PIECEs. It returns an error only when the
// link must close.
func (l *link) serveOne(ch *channel, job serveJob) error {
	if l.cancelled(job.req) {
		return nil
	}
	l.remember(job)
	maxData := int(l.peerHello().MaxFrame) - wire.PieceHeaderSize
	firstWait := min(5*time.Second, l.n.cfg.RequestTimeout/2)
	for a := job.off; a < job.off+job.n; {
		k := chunkAt(job.size, job.off, job.n, a)
		if a > job.off && l.cancelled(job.req) {
			return nil // the peer drops the rest; a new request gets a new id
		}
		wait := l.n.cfg.RequestTimeout
		if a == job.off {
			wait = firstWait
		}
		ctx, cancel := context.WithTimeout(l.ctx, wait)
		err := l.n.budget.acquire(ctx, l.remote, k.sub, func() { ch.settle() })
		cancel()
		if err != nil {
			if l.ctx.Err() != nil {
				return l.errClosed()
			}
			return l.reject(job.req, wire.CodeBusy, "serving budget full")
		}
		if err := l.n.pace.wait(l.ctx, PriorityDemand, k.b-k.a); err != nil {
			l.n.budget.release(l.remote, k.sub)
			return l.errClosed()
		}
		ch.charge(k.sub)
		err = l.serveChunk(ch, job, k, maxData)
		ch.unhold(k.sub)
		ch.settle()
		if err != nil {
			return err
		}
		a = k.b
	}
	l.n.stats.servedBytes.Add(job.n)
	l.n.addPeerBytes(l.remote, 0, job.n)
	if job.partial {
		l.n.stats.servedPartialBytes.Add(job.n)
	}
	return nil
}

// sliceChunk is the chunk [a, b) of a request's range: its own slice is
// sub bytes, of which the last add are the request's slice bytes
// [pos, pos+add).
type sliceChunk struct{ a, b, sub, add, pos int64 }

// chunkAt returns the chunk that starts at a, of the slice of [off, off+n)
// of a blob of size bytes. The slice is the concatenation of its chunks'
// tails: a chunk's own slice repeats, in front, the size and the parents
// that earlier chunks sent (pre-order puts them first), so the tail is
// what the whole slice adds for it.
func chunkAt(size, off, n, a int64) sliceChunk {
	b := min(a+serveChunk, off+n)
	k := sliceChunk{a: a, b: b, sub: cas.SliceLen(size, a, b-a)}
	if a == off {
		k.add = k.sub
		return k
	}
	k.pos = cas.SliceLen(size, off, a-off)
	k.add = cas.SliceLen(size, off, b-off) - k.pos
	return k
}

// serveChunk reads chunk k of job and writes its tail as PIECEs of at
// most maxData bytes, split evenly so that none is small.
func (l *link) serveChunk(ch *channel, job serveJob, k sliceChunk, maxData int) error {
	a, b, sub, add := k.a, k.b, k.sub, k.add
	bp := serveBufs.Get().(*[]byte)
	defer serveBufs.Put(bp)
	buf := (*bp)[:wire.PieceHeaderSize]
	if cap(buf) < wire.PieceHeaderSize+int(sub) {
		buf = make([]byte, wire.PieceHeaderSize, wire.PieceHeaderSize+int(sub)) // not pooled: out of the ordinary
	}
	l.n.readSem <- struct{}{}
	whole, partial := l.n.cfg.Source.AppendSlice, (func([]byte, cas.CID, int64, int64) ([]byte, error))(nil)
	if ps, ok := l.n.partialSource(); ok {
		partial = ps.AppendPartialSlice
	}
	if us, ok := l.n.uncheckedSource(); ok {
		whole, partial = us.AppendSliceUnchecked, us.AppendPartialSliceUnchecked
	}
	var err error
	if partial != nil && job.partial {
		buf, err = partial(buf, job.cid, a, b-a)
		if errors.Is(err, cas.ErrNotFound) {
			// The download may have finished meanwhile: then it is whole.
			buf, err = whole(buf[:wire.PieceHeaderSize], job.cid, a, b-a)
		}
	} else {
		buf, err = whole(buf, job.cid, a, b-a)
	}
	<-l.n.readSem
	if err == nil && int64(len(buf)) != wire.PieceHeaderSize+sub {
		err = fmt.Errorf("swarm: source gave %d slice bytes for [%d, %d) of %s; want %d", len(buf)-wire.PieceHeaderSize, a, b, job.cid, sub)
	}
	if err != nil {
		code := wire.CodeInternal
		switch {
		case errors.Is(err, cas.ErrNotFound):
			code = wire.CodeNotFound
		case errors.Is(err, cas.ErrCorrupt):
			code = wire.CodeCorrupt
		}
		l.n.log.Warn("swarm: cannot serve", "peer", l.remote, "cid", job.cid, "off", a, "len", b-a, "err", err)
		return l.reject(job.req, code, err.Error())
	}
	// data starts right after a header's room: the header of each PIECE is
	// written over bytes already sent (or not sent at all), in place.
	start := len(buf) - int(add) // slice position k.pos
	nf := (int(add) + maxData - 1) / maxData
	for i := 0; i < nf; i++ {
		lo, hi := int(add)*i/nf, int(add)*(i+1)/nf
		frame := buf[start+lo-wire.PieceHeaderSize : start+hi]
		wire.PutPieceHeader(frame, job.req, uint32(int(k.pos)+lo), hi-lo)
		if i > 0 && l.cancelled(job.req) {
			return nil
		}
		if err := ch.write(l.ctx, frame); err != nil {
			return err
		}
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
