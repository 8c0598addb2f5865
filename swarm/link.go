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
// are queued in SCTP and resumes when the queue drains below lowWater
// (bufferedAmountLowThreshold).
const (
	highWater = 1 << 20
	lowWater  = 512 << 10
)

// channel is one open, detached data channel of a link.
type channel struct {
	l    *link
	dc   *webrtc.DataChannel
	rw   datachannel.ReadWriteCloser
	bulk bool
	low  chan struct{} // signalled by OnBufferedAmountLow
	wsem chan struct{} // one writer at a time; ctx-aware, unlike a mutex
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
	return nil
}

// call is a request we made on a link: a REQUEST (slice assembled from
// PIECEs) or a WANT (answered by HAVE).
type call struct {
	req   uint32
	want  bool
	total int      // REQUEST: slice length
	ch    *channel // REQUEST: the bulk channel its PIECEs arrive on
	buf   []byte
	have  []wire.HaveEntry
	err   error
	done  chan struct{} // closed once, by whoever removes the call from link.calls
}

// serveJob is a REQUEST from the peer, accepted and queued.
type serveJob struct {
	req    uint32
	cid    cas.CID
	off, n int64
}

// link is one WebRTC peer connection to a peer: a control channel and
// bulk channels, speaking the wire protocol in both directions (each side
// may request from the other).
type link struct {
	n          *Node
	remote     peer.ID
	pc         *webrtc.PeerConnection
	expectBulk int
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
	ctl      *channel
	bulk     []*channel
	hello    wire.Hello // the peer's, once ready is closed
	nextReq  uint32
	calls    map[uint32]*call
	serving  map[uint32]bool // queued or running REQUESTs of the peer -> cancelled
	labels   map[string]bool // channels the peer announced (answerer)
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
	if len(der) == 0 || !slices.Contains(fps, certFingerprint(der)) {
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
	ctl, bulk := l.ctl, slices.Clone(l.bulk)
	l.mu.Unlock()
	l.wg.Add(2 + 2*len(bulk))
	go l.readLoop(ctl)
	for _, ch := range bulk {
		go l.readLoop(ch)
		go l.serveLoop(ch)
	}
	go l.helloTimeout()
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
		if !l.finishCall(f.Req, func(c *call) { c.err = &RejectError{Peer: l.remote, Req: f.Req, Code: f.Code, Reason: f.Reason} }) {
			return l.staleOrBogus(f)
		}
		return nil
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
		fill(c)
	}
	l.mu.Unlock()
	if c != nil {
		close(c.done)
	}
	return c != nil
}

func (l *link) have(f *wire.Frame) error {
	if f.Req == 0 {
		return nil // announcements: not used by this version's scheduler
	}
	l.mu.Lock()
	c := l.calls[f.Req]
	if c == nil {
		l.mu.Unlock()
		return l.staleOrBogus(f)
	}
	if !c.want {
		l.mu.Unlock()
		return protoErr(l.remote, "HAVE answers REQUEST %d", f.Req)
	}
	delete(l.calls, f.Req)
	// f.Have aliases the read buffer: copy it out.
	for _, e := range f.Have {
		e.Bitmap = slices.Clone(e.Bitmap)
		c.have = append(c.have, e)
	}
	l.mu.Unlock()
	close(c.done)
	return nil
}

// staleOrBogus accepts an answer to a request we abandoned (cancelled or
// timed out) and refuses one to a request never made. Request ids only
// grow, so the two are told apart without remembering old ids.
func (l *link) staleOrBogus(f *wire.Frame) error {
	l.mu.Lock()
	issued := f.Req != 0 && f.Req <= l.nextReq
	l.mu.Unlock()
	if issued {
		return nil
	}
	return protoErr(l.remote, "%v for request %d, never made", f.Type, f.Req)
}

func (l *link) piece(ch *channel, f *wire.Frame) error {
	l.mu.Lock()
	c := l.calls[f.Req]
	if c == nil {
		l.mu.Unlock()
		return l.staleOrBogus(f)
	}
	switch {
	case c.want:
		l.mu.Unlock()
		return protoErr(l.remote, "PIECE answers WANT %d", f.Req)
	case c.ch != nil && c.ch != ch:
		l.mu.Unlock()
		return protoErr(l.remote, "PIECEs of request %d on two channels", f.Req)
	case int(f.Pos) != len(c.buf) || len(c.buf)+len(f.Data) > c.total:
		l.mu.Unlock()
		return protoErr(l.remote, "PIECE of request %d at %d+%d; expected offset %d of a %d-byte slice", f.Req, f.Pos, len(f.Data), len(c.buf), c.total)
	}
	c.ch = ch
	c.buf = append(c.buf, f.Data...)
	complete := len(c.buf) == c.total
	if complete {
		delete(l.calls, f.Req)
	}
	l.mu.Unlock()
	if complete {
		close(c.done)
	}
	return nil
}

// newCall registers a call and returns it.
func (l *link) newCall(want bool, total int, buf []byte) (*call, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		if l.err != nil {
			return nil, l.err
		}
		return nil, ErrLinkClosed
	}
	l.nextReq++
	c := &call{req: l.nextReq, want: want, total: total, buf: buf[:0], done: make(chan struct{})}
	l.calls[c.req] = c
	return c, nil
}

// wait waits for c; on ctx's end or a timeout it abandons c (telling the
// peer with CANCEL if cancel is set).
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
		err = fmt.Errorf("swarm: request %d to %s: no answer in %v", c.req, l.remote, l.n.cfg.RequestTimeout)
	}
	l.mu.Lock()
	_, pending := l.calls[c.req]
	delete(l.calls, c.req)
	l.mu.Unlock()
	if !pending { // finished meanwhile
		<-c.done
		return c.err
	}
	if cancel {
		cctx, stop := context.WithTimeout(l.ctx, time.Second)
		l.ctl.write(cctx, wire.AppendCancel(nil, c.req))
		stop()
	}
	return err
}

// Request fetches the bao slice of [off, off+n) of blob c (of the given
// size) into buf (reallocated if too small) and returns it. The slice is not
// verified here: the caller hands it to a cas.Partial.
func (l *link) request(ctx context.Context, c cas.CID, size, off, n int64, buf []byte) ([]byte, error) {
	total := int(cas.SliceLen(size, off, n))
	if cap(buf) < total {
		buf = make([]byte, 0, total)
	}
	cl, err := l.newCall(false, total, buf)
	if err != nil {
		return nil, err
	}
	if err := l.ctl.write(ctx, wire.AppendRequest(make([]byte, 0, 64), cl.req, c, uint64(off), uint32(n))); err != nil {
		l.finishCall(cl.req, func(*call) {})
		return nil, err
	}
	if err := l.wait(ctx, cl, true); err != nil {
		return nil, err
	}
	return cl.buf, nil
}

// want asks which of cids the peer holds.
func (l *link) want(ctx context.Context, cids []cas.CID) ([]wire.HaveEntry, error) {
	var out []wire.HaveEntry
	for len(cids) > 0 {
		batch := cids[:min(len(cids), wire.MaxWant)]
		cids = cids[len(batch):]
		cl, err := l.newCall(true, 0, nil)
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

// serveWant answers WANT with the blobs we hold whole.
func (l *link) serveWant(f *wire.Frame) error {
	var have []wire.HaveEntry
	if src := l.n.cfg.Source; src != nil {
		for _, c := range f.Want {
			if inf, err := src.Stat(c); err == nil && !inf.Corrupt {
				have = append(have, wire.HaveEntry{CID: c, Size: uint64(inf.Size)})
			}
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
	switch {
	case err != nil:
		return l.reject(f.Req, wire.CodeNotFound, "blob "+f.CID.String()+" not stored here")
	case inf.Corrupt:
		return l.reject(f.Req, wire.CodeCorrupt, "our copy of "+f.CID.String()+" is corrupt")
	}
	off, n, size := int64(f.Off), int64(f.Len), inf.Size
	switch {
	case off%cas.GroupSize != 0 || off >= size || n > size-off:
		return l.reject(f.Req, wire.CodeBadRequest, fmt.Sprintf("range [%d, %d) is unaligned or outside a %d-byte blob", off, off+n, size))
	case n%cas.GroupSize != 0 && off+n != size:
		return l.reject(f.Req, wire.CodeBadRequest, fmt.Sprintf("length %d is not a multiple of %d and does not end the blob", n, cas.GroupSize))
	}
	l.mu.Lock()
	if _, dup := l.serving[f.Req]; dup {
		l.mu.Unlock()
		return protoErr(l.remote, "request id %d reused while outstanding", f.Req)
	}
	select {
	case l.serveQ <- serveJob{req: f.Req, cid: f.CID, off: off, n: n}:
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

// serveLoop answers queued REQUESTs, sending each slice as PIECEs on ch.
func (l *link) serveLoop(ch *channel) {
	defer l.wg.Done()
	var slice []byte
	frame := make([]byte, wire.MaxFrame)
	for {
		select {
		case job := <-l.serveQ:
			var err error
			slice, err = l.serveOne(ch, job, slice[:0], frame)
			l.mu.Lock()
			delete(l.serving, job.req)
			l.mu.Unlock()
			if err != nil {
				l.close(err)
				return
			}
		case <-l.done:
			return
		}
	}
}

func (l *link) serveOne(ch *channel, job serveJob, slice, frame []byte) ([]byte, error) {
	if l.cancelled(job.req) {
		return slice, nil
	}
	slice, err := l.n.cfg.Source.AppendSlice(slice, job.cid, job.off, job.n)
	if err != nil {
		code := wire.CodeInternal
		switch {
		case errors.Is(err, cas.ErrNotFound):
			code = wire.CodeNotFound
		case errors.Is(err, cas.ErrCorrupt):
			code = wire.CodeCorrupt
		}
		l.n.log.Warn("swarm: cannot serve", "peer", l.remote, "cid", job.cid, "off", job.off, "len", job.n, "err", err)
		return slice, l.reject(job.req, code, err.Error())
	}
	l.mu.Lock()
	maxData := int(l.hello.MaxFrame) - wire.PieceHeaderSize
	l.mu.Unlock()
	for pos := 0; pos < len(slice); {
		if pos > 0 && l.cancelled(job.req) {
			return slice, nil // the peer drops the rest; a new request gets a new id
		}
		k := min(maxData, len(slice)-pos)
		wire.PutPieceHeader(frame, job.req, uint32(pos), k)
		copy(frame[wire.PieceHeaderSize:], slice[pos:pos+k])
		if err := ch.write(l.ctx, frame[:wire.PieceHeaderSize+k]); err != nil {
			return slice, err
		}
		pos += k
	}
	l.n.stats.servedBytes.Add(job.n)
	return slice, nil
}

// abort tells the peer why the link closes (REJECT with id 0), waits
// briefly for that frame to be acknowledged, and closes.
func (l *link) abort(code wire.Code, reason string) {
	l.n.record(Event{Peer: l.remote, Kind: EventProtocol, Detail: code.String() + ": " + reason})
	l.n.log.Warn("swarm: closing connection", "peer", l.remote, "code", code, "reason", reason)
	l.say(code, reason)
	l.close(&ProtocolError{Peer: l.remote, Code: code, Reason: reason})
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
