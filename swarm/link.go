package swarm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/datachannel"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// Channel labels (PROTOCOL.md, "Channels").
const (
	ctlLabel        = "rdrr/1/ctl"
	bulkLabelPrefix = "rdrr/1/bulk/"
)

// Flow control per channel: a writer waits while more than highWater bytes
// are queued in SCTP (sent and not yet acknowledged, or not yet sent) and
// resumes when the queue drains below lowWater
// (bufferedAmountLowThreshold). A link's two bulk channels together hold
// the peer's whole SCTP receive window, which bounds what one association
// has in flight: with 1 MiB a channel, the serving end had at most about
// 2 MiB in flight on each connection, 2 MiB a round trip: about 80 MB/s
// over four connections across 80 ms (swarm/BENCHMARKS.md, "round
// trips"). The node's serving budget bounds what a peer's connections
// hold in all.
const (
	highWater = sctpRecvBuffer / 2
	lowWater  = highWater / 2
)

// channel is one open, detached data channel of a link.
type channel struct {
	l    *link
	dc   *webrtc.DataChannel
	rw   datachannel.ReadWriteCloser
	bulk bool
	low  chan struct{} // signalled by OnBufferedAmountLow
	wsem chan struct{} // one writer at a time; ctx-aware, unlike a mutex

	mu      sync.Mutex
	charged int64 // serving budget this channel pays for (serve.go)
	holding int64 // of which in read buffers, not yet in SCTP's queue

	recvReq uint32       // guarded by l.mu: the request whose PIECEs arrive here, while incomplete
	written atomic.Int64 // bytes written (the peer acknowledged written - BufferedAmount)
}

// write sends one frame, waiting (within ctx) while the channel is over its
// high-water mark. Safe for concurrent use; b is not kept.
func (ch *channel) write(ctx context.Context, b []byte) error {
	select {
	case ch.wsem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-ch.l.done:
		return ch.l.errClosed()
	}
	defer func() { <-ch.wsem }()
	var stuck <-chan time.Time
	for ch.dc.BufferedAmount() > highWater {
		if stuck == nil {
			t := time.NewTimer(ch.l.n.cfg.RequestTimeout)
			defer t.Stop()
			stuck = t.C
		}
		select {
		case <-ch.low:
		case <-ctx.Done():
			return ctx.Err()
		case <-ch.l.done:
			return ch.l.errClosed()
		case <-stuck:
			// A peer that stops reading holds our goroutines: drop it.
			err := fmt.Errorf("%w: %s has not read %s for %v", ErrLinkClosed, ch.l.remote, ch.dc.Label(), ch.l.n.cfg.RequestTimeout)
			ch.l.close(err)
			return err
		}
	}
	if _, err := ch.rw.Write(b); err != nil {
		return fmt.Errorf("%w: write: %v", ErrLinkClosed, err)
	}
	ch.written.Add(int64(len(b)))
	return nil
}

// call is a request we made on a link: a REQUEST (slice assembled from
// PIECEs) or a WANT (answered by HAVE).
type call struct {
	req   uint32
	want  bool
	asked []cas.CID // WANT: the CIDs asked
	total int       // REQUEST: slice length
	ch    *channel  // REQUEST: the bulk channel its PIECEs arrive on
	buf   []byte
	first time.Time // REQUEST: when its first PIECE arrived
	have  []wire.HaveEntry
	err   error
	done  chan struct{} // closed once, by whoever removes the call from link.calls
}

// abandonedCall is a request we gave up (timeout, cancellation) whose
// answer may still be under way: the peer may finish or stop its slice,
// but not send more than it. Its buffer is the caller's again, so only
// positions are kept.
type abandonedCall struct {
	want       bool
	ch         *channel
	got, total int
}

// Bounds on answers to requests that are no longer pending
// (PROTOCOL.md, PIECE): abandoned requests remembered per link, and frames
// tolerated for requests neither pending nor remembered.
const (
	maxAbandoned = 256
	maxStale     = 64
)

// link is one WebRTC peer connection to a peer: a control channel and
// bulk channels, speaking the wire protocol in both directions (each side
// may request from the other).
type link struct {
	n          *Node
	remote     peer.ID
	pc         *webrtc.PeerConnection
	expectBulk int
	big        bool            // we send big SCTP packets (transport.go); set before the link starts, under mu
	ctx        context.Context // cancelled when the link closes
	cancel     context.CancelFunc
	ready      chan struct{} // closed when the peer's HELLO arrived
	done       chan struct{} // closed when the link closed
	serveQ     chan serveJob
	wg         sync.WaitGroup // readers, serve workers, shutdown

	mu       sync.Mutex
	fps      []string // the peer's signed DTLS fingerprints
	verified bool
	started  bool
	closed   bool
	err      error
	aborting *ProtocolError // set when we start closing the link for a violation
	ctl      *channel
	bulk     []*channel
	hello    wire.Hello // the peer's, once ready is closed
	nextReq  uint32
	calls    map[uint32]*call
	gaveUp   map[uint32]*abandonedCall // at most maxAbandoned
	stale    int                       // frames for requests finished or forgotten
	serving  map[uint32]bool           // queued or running REQUESTs of the peer -> cancelled
	labels   map[string]bool           // channels the peer announced (answerer)

	// served: the last requests served, servedNext counts them all
	// (checkServed).
	served     [servedMemory]servedRange
	servedNext int
}

func newLink(n *Node, remote peer.ID, pc *webrtc.PeerConnection, expectBulk int) *link {
	ctx, cancel := context.WithCancel(n.ctx)
	l := &link{
		n:          n,
		remote:     remote,
		pc:         pc,
		expectBulk: expectBulk,
		ctx:        ctx,
		cancel:     cancel,
		ready:      make(chan struct{}),
		done:       make(chan struct{}),
		serveQ:     make(chan serveJob, n.cfg.MaxOutstanding),
		calls:      make(map[uint32]*call),
		gaveUp:     make(map[uint32]*abandonedCall),
		serving:    make(map[uint32]bool),
		labels:     make(map[string]bool),
	}
	pc.OnConnectionStateChange(l.onState)
	return l
}

func (l *link) String() string { return "link to " + l.remote.String() }

func (l *link) errClosed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	return ErrLinkClosed
}

// addChannel prepares dc (created by us, or announced by the peer) to be
// detached when it opens.
func (l *link) addChannel(dc *webrtc.DataChannel, bulk bool) {
	ch := &channel{l: l, dc: dc, bulk: bulk, low: make(chan struct{}, 1), wsem: make(chan struct{}, 1)}
	dc.SetBufferedAmountLowThreshold(lowWater)
	dc.OnBufferedAmountLow(func() {
		select {
		case ch.low <- struct{}{}:
		default:
		}
	})
	dc.OnOpen(func() {
		rw, err := dc.Detach()
		if err != nil {
			l.close(fmt.Errorf("%w: detach %s: %v", ErrLinkClosed, dc.Label(), err))
			return
		}
		ch.rw = rw
		l.mu.Lock()
		if bulk {
			l.bulk = append(l.bulk, ch)
		} else {
			l.ctl = ch
		}
		l.mu.Unlock()
		l.maybeStart()
	})
}

// onDataChannel accepts the channels the offerer announces: one control
// channel and expectBulk bulk channels, nothing else.
func (l *link) onDataChannel(dc *webrtc.DataChannel) {
	label := dc.Label()
	l.mu.Lock()
	ok := false
	bulk := false
	switch {
	case l.labels[label]: // a duplicate
	case label == ctlLabel:
		ok = dc.Ordered()
	case strings.HasPrefix(label, bulkLabelPrefix):
		i, err := strconv.Atoi(label[len(bulkLabelPrefix):])
		ok, bulk = err == nil && i >= 0 && i < l.expectBulk && dc.Ordered() && label == bulkLabelPrefix+strconv.Itoa(i), true
	}
	if ok {
		l.labels[label] = true
	}
	l.mu.Unlock()
	if !ok {
		l.n.record(Event{Peer: l.remote, Kind: EventProtocol, Detail: "unexpected data channel " + strconv.Quote(label)})
		l.close(&ProtocolError{Peer: l.remote, Code: wire.CodeProtocol, Reason: "unexpected data channel " + strconv.Quote(label)})
		return
	}
	l.addChannel(dc, bulk)
}

func (l *link) onState(st webrtc.PeerConnectionState) {
	switch st {
	case webrtc.PeerConnectionStateConnected:
		l.verifyRemote()
	case webrtc.PeerConnectionStateFailed, webrtc.PeerConnectionStateClosed:
		l.close(fmt.Errorf("%w: peer connection %v", ErrLinkClosed, st))
	}
}

// verifyRemote checks the certificate the peer completed DTLS with against
// the fingerprints it signed. Until it passes, no frame is read or written.
func (l *link) verifyRemote() {
	var der []byte
	if sctp := l.pc.SCTP(); sctp != nil && sctp.Transport() != nil {
		der = sctp.Transport().GetRemoteCertificate()
	}
	l.mu.Lock()
	fps := l.fps
	l.mu.Unlock()
	if len(der) == 0 && dtlsChecksSignedFingerprint() {
		// A browser that cannot show the certificate (PROTOCOL.md 2.2):
		// its DTLS stack refused any certificate but the one of the
		// SDP, whose signature was checked before it was applied.
	} else if len(der) == 0 || !slices.Contains(fps, certFingerprint(der)) {
		err := &IdentityError{Peer: l.remote, Reason: "DTLS certificate is not the one the peer signed"}
		l.n.record(Event{Peer: l.remote, Kind: EventIdentity, Detail: err.Reason})
		l.close(err)
		return
	}
	l.mu.Lock()
	l.verified = true
	l.mu.Unlock()
	l.maybeStart()
}

// maybeStart starts the readers and serve workers once the peer is verified
// and every channel is open.
func (l *link) maybeStart() {
	l.mu.Lock()
	if l.started || l.closed || !l.verified || l.ctl == nil || len(l.bulk) < l.expectBulk {
		l.mu.Unlock()
		return
	}
	l.started = true
	ctl, bulk, big := l.ctl, slices.Clone(l.bulk), l.big
	// Counted before the lock is let go: close sets closed under it, so
	// these are counted before it closes done, after which Node.Close
	// waits for l.wg (an Add after that Wait had begun was a race: an
	// OnOpen callback starting the link while the node closed).
	n := 2 + 2*len(bulk)
	if big {
		n++
	}
	l.wg.Add(n)
	l.mu.Unlock()
	go l.readLoop(ctl)
	for _, ch := range bulk {
		if l.n.cfg.testHooks.noReadBulk {
			l.wg.Done()
		} else {
			go l.readLoop(ch)
		}
		go l.serveLoop(ch)
	}
	go l.helloTimeout()
	if big {
		go l.watchBigMTU()
	}
}

func (l *link) helloTimeout() {
	defer l.wg.Done()
	t := time.NewTimer(l.n.cfg.ConnectTimeout)
	defer t.Stop()
	select {
	case <-l.ready:
	case <-l.done:
	case <-t.C:
		l.abort(wire.CodeTimeout, "no HELLO")
	}
}

func (l *link) myHello() wire.Hello {
	h := wire.Hello{
		Version:        wire.Version,
		MaxFrame:       wire.MaxFrame,
		MaxRequest:     wire.MaxRequest,
		MaxOutstanding: uint16(l.n.cfg.MaxOutstanding),
		Agent:          l.n.cfg.Agent,
	}
	if l.n.cfg.Source != nil {
		h.Caps |= wire.CapServe
	}
	// We take partial entries (fetch.go uses them) and, with a
	// PartialSource, announce and serve our own.
	if !l.n.cfg.testHooks.noPartialCap {
		h.Caps |= wire.CapPartial
	}
	if l.n.tr.recvMTU > 0 {
		h.Caps |= wire.CapBigMTU
	}
	return h
}

// readLoop reads frames from one channel until the link closes.
func (l *link) readLoop(ch *channel) {
	defer l.wg.Done()
	if !ch.bulk {
		if err := ch.write(l.ctx, wire.AppendHello(nil, l.myHello())); err != nil {
			l.close(err)
			return
		}
	}
	buf := make([]byte, wire.MaxFrame+1)
	var f wire.Frame
	for {
		n, isString, err := ch.rw.ReadDataChannel(buf)
		switch {
		case errors.Is(err, io.ErrShortBuffer) || err == nil && n > wire.MaxFrame:
			l.abort(wire.CodeFrameTooLarge, fmt.Sprintf("frame larger than %d bytes on %s", wire.MaxFrame, ch.dc.Label()))
			return
		case err != nil:
			l.close(fmt.Errorf("%w: read %s: %v", ErrLinkClosed, ch.dc.Label(), err))
			return
		case isString:
			l.abort(wire.CodeMalformed, "text message on "+ch.dc.Label())
			return
		}
		if err := wire.Decode(buf[:n], wire.MaxFrame, &f); err != nil {
			l.abort(wire.CodeMalformed, err.Error())
			return
		}
		if err := l.handle(ch, &f); err != nil {
			var pe *ProtocolError
			if err == errStop {
				return
			}
			if errors.As(err, &pe) {
				l.abort(pe.Code, pe.Reason)
			} else {
				l.close(err)
			}
			return
		}
	}
}

func protoErr(p peer.ID, format string, args ...any) error {
	return &ProtocolError{Peer: p, Code: wire.CodeProtocol, Reason: fmt.Sprintf(format, args...)}
}

// errStop ends a reader without an abort (the link is already closing).
var errStop = errors.New("stop")

func (l *link) handle(ch *channel, f *wire.Frame) error {
	if ch.bulk {
		if f.Type != wire.TypePiece {
			return protoErr(l.remote, "%v on a bulk channel", f.Type)
		}
		return l.piece(ch, f)
	}
	if f.Type == wire.TypeReject && f.Req == 0 { // allowed at any time
		err := &RejectError{Peer: l.remote, Code: f.Code, Reason: f.Reason}
		level := slog.LevelWarn
		if f.Code == wire.CodeGoingAway {
			level = slog.LevelDebug
		}
		l.n.log.Log(l.ctx, level, "swarm: peer closed the connection", "peer", l.remote, "code", f.Code, "reason", f.Reason)
		if f.Code == wire.CodeBadData {
			l.checkServed()
		}
		l.close(err)
		return errStop
	}
	select {
	case <-l.ready:
	default:
		if f.Type != wire.TypeHello {
			return protoErr(l.remote, "%v before HELLO", f.Type)
		}
		if f.Hello.Version < 1 {
			return &ProtocolError{Peer: l.remote, Code: wire.CodeVersion, Reason: "no common version"}
		}
		l.mu.Lock()
		l.hello = f.Hello
		l.mu.Unlock()
		close(l.ready)
		return nil
	}
	switch f.Type {
	case wire.TypeHave:
		return l.have(f)
	case wire.TypeWant:
		return l.serveWant(f)
	case wire.TypeRequest:
		return l.serveRequest(f)
	case wire.TypeCancel:
		l.mu.Lock()
		if _, ok := l.serving[f.Req]; ok {
			l.serving[f.Req] = true
		}
		l.mu.Unlock()
		return nil
	case wire.TypeReject:
		return l.rejected(f)
	case wire.TypeHello:
		return protoErr(l.remote, "second HELLO")
	}
	return protoErr(l.remote, "%v on the control channel", f.Type)
}

// finishCall completes call req, if it is still pending, after fill sets
// its result. It reports whether the call was pending.
func (l *link) finishCall(req uint32, fill func(*call)) bool {
	l.mu.Lock()
	c := l.calls[req]
	if c != nil {
		delete(l.calls, req)
		if c.ch != nil && c.ch.recvReq == req {
			c.ch.recvReq = 0
		}
		fill(c)
	}
	l.mu.Unlock()
	if c != nil {
		close(c.done)
	}
	return c != nil
}

// rejected handles REJECT for a request of ours: pending (it fails),
// abandoned (forgotten), or neither. A server may give up a request after
// some of its PIECEs (a read that failed midway): the channel is free again.
func (l *link) rejected(f *wire.Frame) error {
	if l.finishCall(f.Req, func(c *call) { c.err = &RejectError{Peer: l.remote, Req: f.Req, Code: f.Code, Reason: f.Reason} }) {
		return nil
	}
	l.mu.Lock()
	a := l.gaveUp[f.Req]
	if a != nil {
		l.forgetLocked(f.Req, a)
	}
	l.mu.Unlock()
	if a != nil {
		return nil
	}
	return l.staleOrBogus(f)
}

// forgetLocked drops an abandoned request whose answer ended. l.mu is held.
func (l *link) forgetLocked(req uint32, a *abandonedCall) {
	delete(l.gaveUp, req)
	if a.ch != nil && a.ch.recvReq == req {
		a.ch.recvReq = 0
	}
}

// abandonLocked remembers c, just removed from l.calls, as abandoned,
// forgetting the oldest one beyond maxAbandoned. l.mu is held.
func (l *link) abandonLocked(c *call) {
	if len(l.gaveUp) >= maxAbandoned {
		oldest := ^uint32(0)
		for id := range l.gaveUp {
			oldest = min(oldest, id)
		}
		l.forgetLocked(oldest, l.gaveUp[oldest])
	}
	l.gaveUp[c.req] = &abandonedCall{want: c.want, ch: c.ch, got: len(c.buf), total: c.total}
}

func (l *link) have(f *wire.Frame) error {
	if f.Req == 0 {
		// An announcement: the fetches in progress take it (partial.go).
		l.n.announced(l.remote, f.Have)
		return nil
	}
	l.mu.Lock()
	c := l.calls[f.Req]
	if c == nil {
		a := l.gaveUp[f.Req]
		if a == nil {
			l.mu.Unlock()
			return l.staleOrBogus(f)
		}
		if !a.want {
			l.mu.Unlock()
			return protoErr(l.remote, "HAVE answers REQUEST %d", f.Req)
		}
		l.forgetLocked(f.Req, a)
		l.mu.Unlock()
		return nil
	}
	if !c.want {
		l.mu.Unlock()
		return protoErr(l.remote, "HAVE answers REQUEST %d", f.Req)
	}
	have, err := acceptHave(c.asked, f.Have, l.myHello().Caps&wire.CapPartial != 0)
	if err != nil {
		l.mu.Unlock()
		return protoErr(l.remote, "HAVE for WANT %d: %v", f.Req, err)
	}
	delete(l.calls, f.Req)
	c.have = have
	l.mu.Unlock()
	close(c.done)
	return nil
}

// acceptHave checks the entries of a HAVE that answers a WANT for asked
// and returns them copied out of the frame: each a blob that was asked
// for, listed once, held whole (PROTOCOL.md, WANT). So a WANT collects at
// most one entry per CID it asked for.
func acceptHave(asked []cas.CID, got []wire.HaveEntry, partial bool) ([]wire.HaveEntry, error) {
	if len(got) > len(asked) {
		return nil, fmt.Errorf("%d entries for %d CIDs asked", len(got), len(asked))
	}
	listed := make(map[cas.CID]bool, len(asked))
	for _, c := range asked {
		listed[c.Raw()] = false // HAVE entries carry digests: raw CIDs
	}
	out := make([]wire.HaveEntry, 0, len(got))
	for i, e := range got {
		done, ok := listed[e.CID]
		switch {
		case !ok:
			return nil, fmt.Errorf("entry %d: %s was not asked for", i, e.CID)
		case done:
			return nil, fmt.Errorf("entry %d: %s listed twice", i, e.CID)
		case e.Bitmap != nil && !partial:
			return nil, fmt.Errorf("entry %d: %s is partial; a WANT is answered with whole blobs", i, e.CID)
		}
		listed[e.CID] = true
		// A bitmap aliases the frame's buffer.
		out = append(out, wire.HaveEntry{CID: e.CID, Size: e.Size, Bitmap: slices.Clone(e.Bitmap)})
	}
	return out, nil
}

// staleOrBogus accepts, up to maxStale frames per link, an answer to a
// request that is neither pending nor remembered as abandoned (finished,
// or abandoned long ago), and refuses one to a request never made. Request
// ids only grow, so the two are told apart without remembering old ids.
func (l *link) staleOrBogus(f *wire.Frame) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.Req == 0 || f.Req > l.nextReq {
		return protoErr(l.remote, "%v for request %d, never made", f.Type, f.Req)
	}
	if l.stale++; l.stale > maxStale {
		return protoErr(l.remote, "more than %d frames for requests already answered (%v for request %d)", maxStale, f.Type, f.Req)
	}
	return nil
}

// piece takes a PIECE: the next part of the slice of a pending request (or
// of one we abandoned), on the request's channel, at least
// wire.MinPieceData bytes unless it ends the slice, never past its end;
// and, on a channel whose previous answer is incomplete, only if that
// answer was abandoned (PROTOCOL.md, PIECE).
func (l *link) piece(ch *channel, f *wire.Frame) error {
	l.mu.Lock()
	if cur := ch.recvReq; cur != 0 && cur != f.Req {
		if c := l.calls[cur]; c != nil {
			got, total := len(c.buf), c.total
			l.mu.Unlock()
			return &ProtocolError{Peer: l.remote, Code: wire.CodeProtocol, Reason: fmt.Sprintf(
				"slice of request %d ended after %d of %d bytes: PIECE of request %d followed on %s", cur, got, total, f.Req, ch.dc.Label())}
		}
		if a := l.gaveUp[cur]; a != nil {
			l.forgetLocked(cur, a) // we gave up on it; so may the server
		}
		ch.recvReq = 0
	}
	c := l.calls[f.Req]
	if c == nil {
		a := l.gaveUp[f.Req]
		if a == nil {
			l.mu.Unlock()
			return l.staleOrBogus(f)
		}
		if err := l.checkPiece(ch, f, a.want, a.ch, a.got, a.total); err != nil {
			l.mu.Unlock()
			return err
		}
		a.ch, a.got = ch, a.got+len(f.Data)
		ch.recvReq = f.Req
		if a.got == a.total {
			l.forgetLocked(f.Req, a)
		}
		l.mu.Unlock()
		return nil
	}
	if err := l.checkPiece(ch, f, c.want, c.ch, len(c.buf), c.total); err != nil {
		l.mu.Unlock()
		return err
	}
	c.ch = ch
	ch.recvReq = f.Req
	if len(c.buf) == 0 {
		c.first = time.Now()
	}
	c.buf = append(c.buf, f.Data...)
	complete := len(c.buf) == c.total
	if complete {
		delete(l.calls, f.Req)
		ch.recvReq = 0
	}
	l.mu.Unlock()
	if complete {
		close(c.done)
	}
	return nil
}

// checkPiece checks f against what its request has received: got of total
// slice bytes, on channel on (nil: none yet).
func (l *link) checkPiece(ch *channel, f *wire.Frame, want bool, on *channel, got, total int) error {
	n := len(f.Data)
	switch {
	case want:
		return protoErr(l.remote, "PIECE answers WANT %d", f.Req)
	case on != nil && on != ch:
		return protoErr(l.remote, "PIECEs of request %d on two channels", f.Req)
	case int64(f.Pos) != int64(got) || got+n > total:
		return protoErr(l.remote, "PIECE of request %d at %d+%d; expected offset %d of a %d-byte slice", f.Req, f.Pos, n, got, total)
	case n < wire.MinPieceData && got+n != total:
		return protoErr(l.remote, "PIECE of request %d carries %d bytes; want at least %d unless it ends the slice", f.Req, n, wire.MinPieceData)
	}
	return nil
}

// newCall registers a call and returns it.
func (l *link) newCall(want bool, asked []cas.CID, total int, buf []byte) (*call, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		if l.err != nil {
			return nil, l.err
		}
		return nil, ErrLinkClosed
	}
	l.nextReq++
	c := &call{req: l.nextReq, want: want, asked: asked, total: total, buf: buf[:0], done: make(chan struct{})}
	l.calls[c.req] = c
	return c, nil
}

// wait waits for c; on ctx's end or a timeout it abandons c (telling the
// peer with CANCEL if cancel is set). A timeout is a *RequestTimeoutError.
func (l *link) wait(ctx context.Context, c *call, cancel bool) error {
	t := time.NewTimer(l.n.cfg.RequestTimeout)
	defer t.Stop()
	var err error
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
	}
	l.mu.Lock()
	_, pending := l.calls[c.req]
	if pending {
		delete(l.calls, c.req)
		l.abandonLocked(c)
	}
	got := len(c.buf)
	l.mu.Unlock()
	if !pending { // finished meanwhile
		<-c.done
		return c.err
	}
	if err == nil {
		err = &RequestTimeoutError{Peer: l.remote, Req: c.req, Got: got, Want: c.total, After: l.n.cfg.RequestTimeout}
	}
	if cancel {
		cctx, stop := context.WithTimeout(l.ctx, time.Second)
		l.ctl.write(cctx, wire.AppendCancel(nil, c.req))
		stop()
	}
	return err
}

// request fetches the bao slice of [off, off+n) of blob c (of the given
// size) into buf (reallocated if too small) and returns it. The slice is not
// verified here: the caller hands it to a cas.Partial. Errors are listed
// in errors.go.
func (l *link) request(ctx context.Context, c cas.CID, size, off, n int64, buf []byte) ([]byte, error) {
	slice, _, err := l.requestTimed(ctx, c, size, off, n, buf)
	return slice, err
}

// requestTimed is request that also returns how long the first byte of
// the answer took from the moment the REQUEST was handed to the control
// channel: the round trip, plus whatever the request waited in the
// peer's queue.
func (l *link) requestTimed(ctx context.Context, c cas.CID, size, off, n int64, buf []byte) ([]byte, time.Duration, error) {
	total := int(cas.SliceLen(size, off, n))
	if cap(buf) < total {
		buf = make([]byte, 0, total)
	}
	cl, err := l.newCall(false, nil, total, buf)
	if err != nil {
		return nil, 0, err
	}
	sent := time.Now()
	if err := l.ctl.write(ctx, wire.AppendRequest(make([]byte, 0, 64), cl.req, c, uint64(off), uint32(n))); err != nil {
		l.finishCall(cl.req, func(*call) {})
		return nil, 0, err
	}
	if err := l.wait(ctx, cl, true); err != nil {
		return nil, 0, err
	}
	return cl.buf, max(0, cl.first.Sub(sent)), nil
}

// want asks which of cids the peer holds whole. It sends as many WANTs as
// the peer's max_frame and ours require (wire.WantLimit) and returns at
// most one entry per distinct CID, each one asked for.
func (l *link) want(ctx context.Context, cids []cas.CID) ([]wire.HaveEntry, error) {
	limit := wire.WantLimit(int(l.peerHello().MaxFrame), wire.MaxFrame)
	seen := make(map[cas.CID]bool, len(cids))
	cids = slices.DeleteFunc(slices.Clone(cids), func(c cas.CID) bool {
		dup := seen[c]
		seen[c] = true
		return dup
	})
	var out []wire.HaveEntry
	for len(cids) > 0 {
		batch := cids[:min(len(cids), limit)]
		cids = cids[len(batch):]
		cl, err := l.newCall(true, batch, 0, nil)
		if err != nil {
			return nil, err
		}
		if err := l.ctl.write(ctx, wire.AppendWant(nil, cl.req, batch)); err != nil {
			l.finishCall(cl.req, func(*call) {})
			return nil, err
		}
		if err := l.wait(ctx, cl, false); err != nil {
			return nil, err
		}
		out = append(out, cl.have...)
	}
	return out, nil
}

// abort tells the peer why the link closes (REJECT with id 0), waits
// briefly for that frame to be acknowledged, and closes.
func (l *link) abort(code wire.Code, reason string) {
	l.n.record(Event{Peer: l.remote, Kind: EventProtocol, Detail: code.String() + ": " + reason})
	l.n.log.Warn("swarm: closing connection", "peer", l.remote, "code", code, "reason", reason)
	pe := &ProtocolError{Peer: l.remote, Code: code, Reason: reason}
	l.mu.Lock()
	if l.aborting == nil {
		l.aborting = pe // the peer may hang up while we say why: the reason stays ours
	}
	l.mu.Unlock()
	l.say(code, reason)
	l.close(pe)
	l.n.strike(l.remote, code.String()+": "+reason)
}

// say sends a connection-level REJECT and waits up to a second for SCTP to
// deliver it.
func (l *link) say(code wire.Code, reason string) {
	l.mu.Lock()
	ctl, started := l.ctl, l.started
	l.mu.Unlock()
	if ctl == nil || !started {
		return
	}
	ctx, cancel := context.WithTimeout(l.ctx, time.Second)
	defer cancel()
	if ctl.write(ctx, wire.AppendReject(nil, 0, code, reason)) != nil {
		return
	}
	for ctl.dc.BufferedAmount() > 0 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

// close ends the link with err: pending calls fail with it, workers stop,
// and the peer connection is closed. Safe to call more than once, from any
// goroutine, including pion's callbacks.
func (l *link) close(err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	if l.aborting != nil {
		err = l.aborting
	}
	l.err = err
	calls := l.calls
	l.calls = map[uint32]*call{}
	l.mu.Unlock()
	for _, c := range calls {
		c.err = err
		close(c.done)
	}
	// pion's Close waits for its goroutines, so it must not run inside
	// its callbacks: it gets a goroutine of its own, counted in l.wg
	// before done is closed (the node waits for l.wg after done).
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.pc.Close()
	}()
	close(l.done)
	l.cancel()
	l.n.removeLink(l)
}

// shutdown tells the peer why (REJECT 0) and closes the link, on a
// goroutine owned by the link, so that the caller does not wait for the
// acknowledgement.
func (l *link) shutdown(code wire.Code, reason string, err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.wg.Add(1) // before close() can close done: see close
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		l.say(code, reason)
		l.close(err)
	}()
}

// isClosed reports whether the link has closed.
func (l *link) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// peerHello returns the peer's HELLO (valid once ready is closed).
func (l *link) peerHello() wire.Hello {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hello
}
