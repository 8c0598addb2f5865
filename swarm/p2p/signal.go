package p2p

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/rdrr/peer/signaling"
	"golang.org/x/time/rate"
)

// SignalProtocol is the libp2p stream protocol that carries WebRTC
// signaling between native peers (PROTOCOL.md).
const SignalProtocol protocol.ID = "/rdrr/signal/1"

// maxSignalFrame bounds one signaling frame: the signaling server's
// default message size.
const maxSignalFrame = 64 << 10

// SignalConfig configures a StreamSignaler. Zero values take the
// documented defaults.
type SignalConfig struct {
	// Allow reports whether a peer may signal us (nil: any peer that has
	// a libp2p connection to us). Safe for concurrent use.
	Allow func(peer.ID) bool
	// MessagesPerSecond and Burst bound what one inbound stream may send
	// (default 50/s, burst 200, the signaling server's limits); a stream
	// over them is reset.
	MessagesPerSecond float64
	Burst             int
	// WriteTimeout bounds writing one frame, and how long a received
	// message waits for room in Incoming before it is dropped (default
	// 10 s).
	WriteTimeout time.Duration
	// DialTimeout bounds opening a stream, including a dial when the host
	// knows addresses of a peer it is not connected to (default 10 s).
	DialTimeout time.Duration
	// IdleTimeout closes an inbound stream silent that long (default
	// 60 s); we close our own outbound streams after half of it.
	IdleTimeout time.Duration
	// MaxPeers bounds the peers we hold outbound streams to (default
	// 1024).
	MaxPeers int
	// Inbox is the capacity of Incoming (default 256).
	Inbox  int
	Logger *slog.Logger
}

func (c SignalConfig) withDefaults() SignalConfig {
	if c.MessagesPerSecond <= 0 {
		c.MessagesPerSecond = 50
	}
	if c.Burst <= 0 {
		c.Burst = 200
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = time.Minute
	}
	if c.MaxPeers <= 0 {
		c.MaxPeers = 1024
	}
	if c.Inbox <= 0 {
		c.Inbox = 256
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// SignalStats counts what a StreamSignaler moved and refused.
type SignalStats struct {
	Sent, Received int64
	// Refused counts inbound streams reset for a malformed frame, a
	// message not for us, a rate over the limit, or a peer not allowed.
	Refused int64
	// Dropped counts received messages that found Incoming full.
	Dropped int64
}

// StreamSignaler relays offers, answers, candidates and byes to peers
// over libp2p streams of SignalProtocol. It implements swarm.Signaler: a
// swarm.Node started with it needs no signaling server to reach peers the
// host can reach. The sender of a message is the authenticated peer of
// the stream it came on, so From means what the server's From means.
type StreamSignaler struct {
	h   *Host
	cfg SignalConfig
	in  chan *signaling.Message

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // inbound readers, the idle closer

	sent, received, refused, dropped atomic.Int64

	mu      sync.Mutex
	closed  bool
	out     map[peer.ID]*outStream
	inbound map[network.Stream]struct{}
}

// outStream is our stream to one peer. Messages to a peer go, in order,
// on one stream, as the signaling server relays them in order per sender.
type outStream struct {
	mu   sync.Mutex
	s    network.Stream
	last time.Time
	gone bool // removed from StreamSignaler.out
}

// NewStreamSignaler handles SignalProtocol on h. Close it before h.
func NewStreamSignaler(h *Host, cfg SignalConfig) *StreamSignaler {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	s := &StreamSignaler{
		h: h, cfg: cfg, in: make(chan *signaling.Message, cfg.Inbox),
		ctx: ctx, cancel: cancel,
		out:     make(map[peer.ID]*outStream),
		inbound: make(map[network.Stream]struct{}),
	}
	h.SetStreamHandler(SignalProtocol, s.handle)
	s.wg.Add(1)
	go s.closeIdle()
	return s
}

// Incoming delivers messages from peers, From set to the stream's peer.
// It is closed by Close.
func (s *StreamSignaler) Incoming() <-chan *signaling.Message { return s.in }

// Stats returns the signaler's counters.
func (s *StreamSignaler) Stats() SignalStats {
	return SignalStats{Sent: s.sent.Load(), Received: s.received.Load(), Refused: s.refused.Load(), Dropped: s.dropped.Load()}
}

// Connected reports whether the host has a connection to p, over which
// Send would not need to dial.
func (s *StreamSignaler) Connected(p peer.ID) bool {
	return s.h.Network().Connectedness(p) == network.Connected
}

// Send writes m (a relayed type, To set, From empty) on our stream to
// m.To, opening it if needed. It returns once the frame is written (not
// delivered). Safe for concurrent use.
func (s *StreamSignaler) Send(ctx context.Context, m *signaling.Message) error {
	if !signaling.IsRelay(m.Type) {
		return fmt.Errorf("%w: type %q is not relayed between peers", ErrBadSignal, m.Type)
	}
	to, err := peer.Decode(m.To)
	if err != nil {
		return fmt.Errorf("%w: to: %v", ErrBadSignal, err)
	}
	if to == s.h.ID() {
		return fmt.Errorf("%w: message to self", ErrBadSignal)
	}
	frame, err := encodeSignalFrame(m)
	if err != nil {
		return err
	}
	var o *outStream
	for {
		if o, err = s.outTo(to); err != nil {
			return err
		}
		o.mu.Lock()
		if !o.gone {
			break
		}
		o.mu.Unlock() // closeIdle dropped it meanwhile: take the new one
	}
	defer o.mu.Unlock()
	if s.ctx.Err() != nil {
		return ErrClosed
	}
	// A stream we had may have been closed by the peer (idle) since our
	// last write: a failed write on it is retried once on a new stream.
	for attempt := 0; ; attempt++ {
		reused := o.s != nil
		if o.s == nil {
			dctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
			st, err := s.h.NewStream(dctx, to, SignalProtocol)
			cancel()
			if err != nil {
				return fmt.Errorf("%w: %s: %v", ErrNotConnected, to, err)
			}
			o.s = st
			s.wg.Add(1)
			go s.watch(o, st)
		}
		o.s.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		_, err := o.s.Write(frame)
		if err == nil {
			o.last = time.Now()
			s.sent.Add(1)
			return nil
		}
		o.s.Reset()
		o.s = nil
		if !reused || attempt > 0 || ctx.Err() != nil {
			return fmt.Errorf("p2p: signal %s to %s: %w", m.Type, to, err)
		}
	}
}

// outTo returns the outbound entry of p, made if needed.
func (s *StreamSignaler) outTo(p peer.ID) (*outStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	o := s.out[p]
	if o == nil {
		if len(s.out) >= s.cfg.MaxPeers {
			return nil, fmt.Errorf("p2p: signaling streams open to %d peers (MaxPeers)", len(s.out))
		}
		o = &outStream{last: time.Now()}
		s.out[p] = o
	}
	return o, nil
}

// watch forgets st as soon as the peer closes or resets it (the peer
// never writes on it), so that the next Send opens a new stream instead of
// writing into a dead one.
func (s *StreamSignaler) watch(o *outStream, st network.Stream) {
	defer s.wg.Done()
	var b [1]byte
	st.Read(b[:]) // returns when the stream ends, from either side
	o.mu.Lock()
	if o.s == st {
		o.s = nil
	}
	o.mu.Unlock()
	st.Reset()
}

// closeIdle closes our outbound streams idle for half of IdleTimeout,
// before the peer's read deadline would, so a peer does not reset a
// stream we are about to write to.
func (s *StreamSignaler) closeIdle() {
	defer s.wg.Done()
	idle := s.cfg.IdleTimeout / 2
	t := time.NewTicker(max(idle/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for p, o := range s.out {
			if !o.mu.TryLock() {
				continue // writing now: not idle
			}
			if time.Since(o.last) >= idle {
				if o.s != nil {
					o.s.Close()
					o.s = nil
				}
				o.gone = true
				delete(s.out, p)
			}
			o.mu.Unlock()
		}
		s.mu.Unlock()
	}
}

// handle reads one inbound stream until it ends, breaks a rule, or idles.
func (s *StreamSignaler) handle(st network.Stream) {
	from := st.Conn().RemotePeer()
	if s.cfg.Allow != nil && !s.cfg.Allow(from) {
		s.refused.Add(1)
		st.Reset()
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		st.Reset()
		return
	}
	s.inbound[st] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.inbound, st)
		s.mu.Unlock()
		s.wg.Done()
	}()
	lim := rate.NewLimiter(rate.Limit(s.cfg.MessagesPerSecond), s.cfg.Burst)
	r := bufio.NewReaderSize(st, 4096)
	self := s.h.ID().String()
	for {
		st.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		m, err := readSignalFrame(r)
		if err != nil {
			if errors.Is(err, io.EOF) {
				st.Close()
				return
			}
			if errors.Is(err, ErrBadSignal) {
				s.refused.Add(1)
				s.cfg.Logger.Debug("p2p: signaling frame refused", "peer", from, "err", err)
			}
			st.Reset()
			return
		}
		if m.To != self {
			s.refused.Add(1)
			s.cfg.Logger.Debug("p2p: signaling message not for us", "peer", from, "to", m.To)
			st.Reset()
			return
		}
		if !lim.Allow() {
			s.refused.Add(1)
			s.cfg.Logger.Debug("p2p: signaling rate exceeded", "peer", from)
			st.Reset()
			return
		}
		m.From = from.String()
		s.received.Add(1)
		t := time.NewTimer(s.cfg.WriteTimeout)
		select {
		case s.in <- m:
		case <-t.C:
			s.dropped.Add(1)
		case <-s.ctx.Done():
			t.Stop()
			st.Reset()
			return
		}
		t.Stop()
	}
}

// encodeSignalFrame is m's frame: a canonical unsigned varint length
// (1..64 KiB) and the JSON message, without From.
func encodeSignalFrame(m *signaling.Message) ([]byte, error) {
	body, err := json.Marshal(&signaling.Message{Type: m.Type, To: m.To, SID: m.SID, Data: m.Data})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSignal, err)
	}
	if _, err := decodeSignalBody(body); err != nil {
		return nil, err // what the peer would refuse is not sent
	}
	if len(body) > maxSignalFrame {
		return nil, fmt.Errorf("%w: %d-byte signaling message (limit %d)", ErrTooLarge, len(body), maxSignalFrame)
	}
	return append(binary.AppendUvarint(make([]byte, 0, 3+len(body)), uint64(len(body))), body...), nil
}

// readSignalFrame reads one frame. A malformed one is an error wrapping
// ErrBadSignal; a stream that ends between frames is io.EOF.
func readSignalFrame(r *bufio.Reader) (*signaling.Message, error) {
	var lenBuf [binary.MaxVarintLen64]byte
	k := 0
	for {
		c, err := r.ReadByte()
		if err != nil {
			if k > 0 && errors.Is(err, io.EOF) {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		lenBuf[k] = c
		k++
		if c < 0x80 {
			break
		}
		if k == 3 { // 3 varint bytes hold 2^21 > maxSignalFrame
			return nil, fmt.Errorf("%w: frame length too long", ErrBadSignal)
		}
	}
	n, _ := binary.Uvarint(lenBuf[:k])
	if k != len(binary.AppendUvarint(nil, n)) {
		return nil, fmt.Errorf("%w: frame length is not a canonical varint", ErrBadSignal)
	}
	if n == 0 || n > maxSignalFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes (1..%d)", ErrBadSignal, n, maxSignalFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeSignalBody(body)
}

// decodeSignalBody decodes and checks one message: the signaling
// protocol's strict decoding, a relayed type, To set, From absent (the
// stream says who sent it).
func decodeSignalBody(body []byte) (*signaling.Message, error) {
	m, err := signaling.DecodeMessage(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSignal, err)
	}
	switch {
	case !signaling.IsRelay(m.Type):
		return nil, fmt.Errorf("%w: type %q is not relayed between peers", ErrBadSignal, m.Type)
	case m.To == "":
		return nil, fmt.Errorf("%w: missing to", ErrBadSignal)
	case m.From != "":
		return nil, fmt.Errorf("%w: from is set by the receiver", ErrBadSignal)
	case m.Req != 0 || m.Topic != "" || m.Peers != nil || m.ID != "" || m.Sig != nil || m.Nonce != nil || m.PubKey != nil || m.Code != "" || m.Peer != "" || m.V != 0 || m.Limits != nil || m.Reason != "":
		return nil, fmt.Errorf("%w: fields other than type, to, sid and data", ErrBadSignal)
	}
	return m, nil
}

// Close stops handling SignalProtocol, resets our streams and closes
// Incoming.
func (s *StreamSignaler) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.h.RemoveStreamHandler(SignalProtocol)
	s.cancel()
	for _, o := range s.out {
		o.mu.Lock()
		o.gone = true
		if o.s != nil {
			o.s.Reset()
			o.s = nil
		}
		o.mu.Unlock()
	}
	s.out = nil
	for st := range s.inbound {
		st.Reset()
	}
	s.mu.Unlock()
	s.wg.Wait()
	close(s.in)
	return nil
}
