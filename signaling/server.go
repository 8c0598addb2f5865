package signaling

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"
)

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	// MaxMessageBytes is the largest message accepted from a client
	// (default 64 KiB; an SDP offer with its signature is a few KiB).
	MaxMessageBytes int
	// MessagesPerSecond and Burst bound each client's message rate (token
	// bucket; defaults 50/s and 200).
	MessagesPerSecond float64
	Burst             int
	// MaxPeersPerTopic bounds a topic's members (default 1024).
	MaxPeersPerTopic int
	// MaxTopics bounds the topics one client is in at once (default 16).
	MaxTopics int
	// MaxConns bounds open WebSocket sessions; more are refused with HTTP
	// 503 before the upgrade (default 4096).
	MaxConns int
	// IdleTimeout closes an authenticated client that sent nothing for this
	// long (default 60s; clients send "ping" at a third of it).
	IdleTimeout time.Duration
	// AuthTimeout closes a client that has not authenticated this long
	// after connecting (default 10s).
	AuthTimeout time.Duration
	// WriteTimeout bounds one write to a client (default 10s).
	WriteTimeout time.Duration
	// SendQueue bounds the messages queued for one client; a client whose
	// queue is full is disconnected as a slow consumer (default 256).
	SendQueue int
	// MaxStrikes is how many refused messages (malformed, rate limited) a
	// client may send before it is disconnected (default 32).
	MaxStrikes int
	// OriginPatterns, if set, restricts the browser origins allowed to
	// connect (see websocket.AcceptOptions). By default any origin may:
	// authentication is by signature, not by cookies, so cross-site
	// requests gain nothing.
	OriginPatterns []string
	// Logger receives one line per session event (default: discard).
	Logger *slog.Logger
	// Now is the clock for rate limits and timeouts (default time.Now).
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxMessageBytes, 64<<10)
	def(&c.Burst, 200)
	def(&c.MaxPeersPerTopic, 1024)
	def(&c.MaxTopics, 16)
	def(&c.MaxConns, 4096)
	def(&c.SendQueue, 256)
	def(&c.MaxStrikes, 32)
	if c.MessagesPerSecond <= 0 {
		c.MessagesPerSecond = 50
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&c.IdleTimeout, 60*time.Second)
	defDur(&c.AuthTimeout, 10*time.Second)
	defDur(&c.WriteTimeout, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Server is the signaling server: an http.Handler for WebSocket upgrades.
// Embed it in any http.Server (peer signal, peer daemon) and call Close to
// end every session.
type Server struct {
	cfg    Config
	log    *slog.Logger
	stats  counters
	tick   time.Duration
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // one per session (its ServeHTTP call)

	mu     sync.Mutex
	closed bool
	byID   map[peer.ID]*session
	topics map[string]map[peer.ID]*session
}

// NewServer returns a server with cfg's limits.
func NewServer(cfg Config) *Server {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	tick := min(cfg.IdleTimeout, cfg.AuthTimeout) / 4
	tick = max(tick, 5*time.Millisecond)
	return &Server{
		cfg:    cfg,
		log:    cfg.Logger,
		tick:   tick,
		ctx:    ctx,
		cancel: cancel,
		byID:   make(map[peer.ID]*session),
		topics: make(map[string]map[peer.ID]*session),
	}
}

// Limits returns the limits announced to clients.
func (s *Server) Limits() Limits {
	return Limits{
		MaxMessageBytes:   s.cfg.MaxMessageBytes,
		MessagesPerSecond: s.cfg.MessagesPerSecond,
		Burst:             s.cfg.Burst,
		MaxPeersPerTopic:  s.cfg.MaxPeersPerTopic,
		MaxTopics:         s.cfg.MaxTopics,
		IdleTimeoutMS:     s.cfg.IdleTimeout.Milliseconds(),
	}
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats { return s.stats.snapshot() }

// Close tells every client the server is shutting down, closes their
// sessions and waits for them to end. Later upgrades are refused.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}

// ServeHTTP upgrades to a WebSocket session and serves it until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "signaling: server shutting down", http.StatusServiceUnavailable)
		return
	}
	if s.stats.open.Load() >= int64(s.cfg.MaxConns) {
		s.mu.Unlock()
		s.stats.reject(CodeServerFull)
		http.Error(w, fmt.Sprintf("signaling: %s: %d connections open", CodeServerFull, s.cfg.MaxConns), http.StatusServiceUnavailable)
		return
	}
	s.stats.open.Add(1)
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	defer s.stats.open.Add(-1)

	opts := &websocket.AcceptOptions{OriginPatterns: s.cfg.OriginPatterns}
	if len(s.cfg.OriginPatterns) == 0 {
		opts.InsecureSkipVerify = true // see Config.OriginPatterns
	}
	ws, err := websocket.Accept(w, r, opts)
	if err != nil {
		return // Accept wrote the HTTP error
	}
	s.stats.accepted.Add(1)
	// One more byte than the limit, so that our own check (which answers
	// with an error message) fires before the library's.
	ws.SetReadLimit(int64(s.cfg.MaxMessageBytes) + 1)
	ss := &session{
		srv:    s,
		ws:     ws,
		remote: r.RemoteAddr,
		out:    make(chan []byte, s.cfg.SendQueue),
		quit:   make(chan struct{}),
		lim:    rate.NewLimiter(rate.Limit(s.cfg.MessagesPerSecond), s.cfg.Burst),
		topics: make(map[string]struct{}),
	}
	ss.lastRead.Store(s.cfg.Now().UnixNano())
	ss.run()
}

// session is one client connection. The ServeHTTP goroutine reads; one
// writer goroutine writes and enforces timeouts. Fields marked "mu" are
// guarded by srv.mu.
type session struct {
	srv    *Server
	ws     *websocket.Conn
	remote string
	out    chan []byte   // bounded outbound queue
	quit   chan struct{} // closed once the session must end
	fin    closeInfo     // written before quit is closed
	once   sync.Once
	lim    *rate.Limiter // reader goroutine only
	nonce  []byte        // reader goroutine only

	lastRead atomic.Int64 // unix nanos of the last message read
	authed   atomic.Bool
	strikes  int                 // reader goroutine only
	id       peer.ID             // mu; set once at auth
	topics   map[string]struct{} // mu
}

type closeInfo struct {
	status websocket.StatusCode
	code   string // protocol error code sent before closing; "" for none
	reason string
}

func (ss *session) run() {
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		ss.writeLoop()
	}()
	nonce := make([]byte, NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		ss.fail(websocket.StatusInternalError, "", "no randomness")
	} else {
		ss.nonce = nonce
		lim := ss.srv.Limits()
		ss.send(&Message{Type: TypeChallenge, V: Version, Nonce: nonce, Limits: &lim})
		ss.readLoop()
	}
	ss.fail(websocket.StatusNormalClosure, "", "")
	<-writerDone
	ss.srv.unregister(ss)
}

// fail ends the session: the writer sends an error message with code (if
// any) and closes the WebSocket with status. Safe from any goroutine; the
// first call wins and reports true.
func (ss *session) fail(status websocket.StatusCode, code, reason string) (first bool) {
	ss.once.Do(func() {
		ss.fin = closeInfo{status: status, code: code, reason: reason}
		close(ss.quit)
		first = true
	})
	return first
}

func (ss *session) ended() bool {
	select {
	case <-ss.quit:
		return true
	default:
		return false
	}
}

// send queues m for the client without blocking. A full queue means the
// client does not read: it is disconnected, and send reports false.
func (ss *session) send(m *Message) bool {
	b, err := m.Encode()
	if err != nil {
		ss.srv.log.Error("signaling: encode", "type", m.Type, "err", err)
		return false
	}
	select {
	case ss.out <- b:
		return true
	default:
		if ss.fail(websocket.StatusPolicyViolation, CodeSlowConsumer, "outbound queue full") {
			ss.srv.stats.reject(CodeSlowConsumer)
			ss.srv.log.Info("signaling: slow consumer dropped", "peer", ss.id, "remote", ss.remote)
		}
		return false
	}
}

func (ss *session) writeLoop() {
	t := time.NewTicker(ss.srv.tick)
	defer t.Stop()
	for {
		select {
		case b := <-ss.out:
			if err := ss.write(b); err != nil {
				ss.fail(websocket.StatusNormalClosure, "", "")
				ss.ws.CloseNow()
				return
			}
		case <-t.C:
			ss.checkIdle()
		case <-ss.srv.ctx.Done():
			ss.fail(websocket.StatusGoingAway, CodeShuttingDown, "server shutting down")
		case <-ss.quit:
			fin := ss.fin
			if fin.code != "" {
				b, _ := (&Message{Type: TypeError, Code: fin.code, Reason: fin.reason}).Encode()
				ss.write(b)
			}
			reason := fin.code
			if reason == "" {
				reason = fin.reason
			}
			ss.ws.Close(fin.status, trim(reason)) // reason must stay under 125 bytes
			return
		}
	}
}

func (ss *session) write(b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), ss.srv.cfg.WriteTimeout)
	defer cancel()
	return ss.ws.Write(ctx, websocket.MessageText, b)
}

func (ss *session) checkIdle() {
	idle := ss.srv.cfg.Now().Sub(time.Unix(0, ss.lastRead.Load()))
	limit := ss.srv.cfg.IdleTimeout
	if !ss.authed.Load() {
		limit = ss.srv.cfg.AuthTimeout
	}
	if idle > limit {
		ss.srv.stats.reject(CodeIdleTimeout)
		ss.fail(websocket.StatusPolicyViolation, CodeIdleTimeout, fmt.Sprintf("nothing received for %v", limit))
	}
}

func (ss *session) readLoop() {
	max := ss.srv.cfg.MaxMessageBytes
	for !ss.ended() {
		typ, r, err := ss.ws.Reader(context.Background())
		if err != nil {
			if errors.Is(err, websocket.ErrMessageTooBig) {
				ss.srv.stats.reject(CodeTooLarge)
			}
			return
		}
		b, err := io.ReadAll(io.LimitReader(r, int64(max)+1))
		if err != nil {
			if errors.Is(err, websocket.ErrMessageTooBig) {
				ss.srv.stats.reject(CodeTooLarge)
				ss.fail(websocket.StatusMessageTooBig, CodeTooLarge, fmt.Sprintf("message larger than %d bytes", max))
			}
			return
		}
		if len(b) > max {
			ss.srv.stats.reject(CodeTooLarge)
			ss.fail(websocket.StatusMessageTooBig, CodeTooLarge, fmt.Sprintf("message larger than %d bytes", max))
			return
		}
		ss.lastRead.Store(ss.srv.cfg.Now().UnixNano())
		if typ != websocket.MessageText {
			ss.strike(CodeBadMessage, "binary messages are not part of the protocol", 0)
			continue
		}
		ss.handle(b)
	}
}

// strike refuses one message with an error; too many strikes end the
// session.
func (ss *session) strike(code, reason string, req uint64) {
	ss.srv.stats.reject(code)
	ss.strikes++
	if ss.strikes > ss.srv.cfg.MaxStrikes {
		ss.srv.stats.reject(CodeTooManyErrors)
		ss.fail(websocket.StatusPolicyViolation, CodeTooManyErrors, fmt.Sprintf("more than %d refused messages; last: %s", ss.srv.cfg.MaxStrikes, code))
		return
	}
	ss.send(&Message{Type: TypeError, Req: req, Code: code, Reason: reason})
}

// refuse answers a well-formed request that a limit does not allow; it is
// not a strike.
func (ss *session) refuse(code, reason string, req uint64, peerID string) {
	ss.srv.stats.reject(code)
	ss.send(&Message{Type: TypeError, Req: req, Code: code, Reason: reason, Peer: peerID})
}

func (ss *session) handle(b []byte) {
	m, err := DecodeMessage(b)
	if !ss.authed.Load() {
		ss.auth(m, err)
		return
	}
	if err != nil {
		var de *DecodeError
		errors.As(err, &de)
		ss.strike(de.code(), de.Error(), de.Req)
		return
	}
	if !ss.lim.AllowN(ss.srv.cfg.Now(), 1) {
		ss.strike(CodeRateLimited, fmt.Sprintf("more than %g messages/s (burst %d)", ss.srv.cfg.MessagesPerSecond, ss.srv.cfg.Burst), m.Req)
		return
	}
	switch m.Type {
	case TypeJoin:
		ss.srv.join(ss, m)
	case TypeLeave:
		ss.srv.leave(ss, m.Topic)
		ss.send(&Message{Type: TypeOK, Req: m.Req})
	case TypePeers:
		ss.send(&Message{Type: TypePeers, Req: m.Req, Topic: m.Topic, Peers: ss.srv.members(m.Topic, ss)})
	case TypePing:
		ss.send(&Message{Type: TypePong, Req: m.Req})
	case TypeOffer, TypeAnswer, TypeCandidate, TypeBye:
		ss.srv.relay(ss, m)
	default:
		ss.strike(CodeBadMessage, fmt.Sprintf("%q is not a client message here", m.Type), m.Req)
	}
}

// auth checks the first message: it must be "auth" carrying a valid
// signature of our nonce by the key of the claimed ID, and the ID must not
// be connected already. Any failure ends the session.
func (ss *session) auth(m *Message, decodeErr error) {
	fail := func(code, reason string) {
		ss.srv.stats.reject(code)
		ss.srv.log.Info("signaling: auth refused", "remote", ss.remote, "code", code, "reason", reason)
		ss.fail(websocket.StatusPolicyViolation, code, reason)
	}
	if decodeErr != nil {
		var de *DecodeError
		if errors.As(decodeErr, &de) && de.code() == CodeVersion {
			fail(CodeVersion, de.Error())
			return
		}
		fail(CodeAuthFailed, "first message must be a valid auth: "+decodeErr.Error())
		return
	}
	if m.Type != TypeAuth {
		fail(CodeAuthFailed, fmt.Sprintf("first message must be auth, not %q", m.Type))
		return
	}
	id, err := peer.Decode(m.ID)
	if err != nil {
		fail(CodeAuthFailed, "bad id")
		return
	}
	var pub crypto.PubKey
	if len(m.PubKey) > 0 {
		pub, err = crypto.UnmarshalPublicKey(m.PubKey)
		if err != nil {
			fail(CodeAuthFailed, "bad pub: "+trim(err.Error()))
			return
		}
		if !id.MatchesPublicKey(pub) {
			fail(CodeAuthFailed, "pub does not match id")
			return
		}
	} else if pub, err = id.ExtractPublicKey(); err != nil {
		fail(CodeAuthFailed, "id does not embed its public key; send pub")
		return
	}
	ok, err := pub.Verify(AuthPayload(ss.nonce), m.Sig)
	if err != nil || !ok {
		fail(CodeAuthFailed, "signature does not verify for "+id.String())
		return
	}
	s := ss.srv
	s.mu.Lock()
	if _, dup := s.byID[id]; dup {
		s.mu.Unlock()
		fail(CodeIDInUse, id.String()+" is already connected")
		return
	}
	s.byID[id] = ss
	ss.id = id
	s.mu.Unlock()
	ss.authed.Store(true)
	s.stats.authed.Add(1)
	s.log.Debug("signaling: authenticated", "peer", id, "remote", ss.remote)
	ss.send(&Message{Type: TypeWelcome, ID: id.String()})
}

func (s *Server) join(ss *session, m *Message) {
	t := m.Topic
	s.mu.Lock()
	if _, in := ss.topics[t]; !in {
		if len(ss.topics) >= s.cfg.MaxTopics {
			s.mu.Unlock()
			ss.refuse(CodeTooManyTopics, fmt.Sprintf("already in %d topics", s.cfg.MaxTopics), m.Req, "")
			return
		}
		members := s.topics[t]
		if len(members) >= s.cfg.MaxPeersPerTopic {
			s.mu.Unlock()
			ss.refuse(CodeTopicFull, fmt.Sprintf("topic has %d peers", s.cfg.MaxPeersPerTopic), m.Req, "")
			return
		}
		if members == nil {
			members = make(map[peer.ID]*session)
			s.topics[t] = members
		}
		ev := &Message{Type: TypeJoined, Topic: t, Peer: ss.id.String()}
		for _, o := range members {
			o.send(ev)
		}
		members[ss.id] = ss
		ss.topics[t] = struct{}{}
	}
	peers := s.membersLocked(t, ss)
	s.mu.Unlock()
	ss.send(&Message{Type: TypePeers, Req: m.Req, Topic: t, Peers: peers})
}

func (s *Server) leave(ss *session, t string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leaveLocked(ss, t)
}

func (s *Server) leaveLocked(ss *session, t string) {
	if _, in := ss.topics[t]; !in {
		return
	}
	delete(ss.topics, t)
	members := s.topics[t]
	delete(members, ss.id)
	if len(members) == 0 {
		delete(s.topics, t)
		return
	}
	ev := &Message{Type: TypeLeft, Topic: t, Peer: ss.id.String()}
	for _, o := range members {
		o.send(ev)
	}
}

func (s *Server) members(t string, except *session) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.membersLocked(t, except)
}

func (s *Server) membersLocked(t string, except *session) []string {
	out := make([]string, 0, len(s.topics[t]))
	for id, o := range s.topics[t] {
		if o != except {
			out = append(out, id.String())
		}
	}
	slices.Sort(out)
	return out
}

func (s *Server) relay(ss *session, m *Message) {
	to, err := peer.Decode(m.To)
	if err != nil || m.From != "" {
		ss.strike(CodeBadMessage, "relayed messages carry to, never from", m.Req)
		return
	}
	if to == ss.id {
		ss.strike(CodeBadMessage, "cannot signal yourself", m.Req)
		return
	}
	s.mu.Lock()
	target := s.byID[to]
	s.mu.Unlock()
	if target == nil {
		ss.refuse(CodeUnknownPeer, "peer is not connected", m.Req, m.To)
		return
	}
	fwd := &Message{Type: m.Type, From: ss.id.String(), SID: m.SID, Data: m.Data}
	s.stats.relayed.Add(1) // before the send, so a receiver never sees an uncounted message
	if !target.send(fwd) {
		s.stats.relayed.Add(-1)
		ss.refuse(CodeUnknownPeer, "peer does not read its messages and was disconnected", m.Req, m.To)
	}
}

func (s *Server) unregister(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss.id == "" || s.byID[ss.id] != ss {
		return
	}
	for t := range ss.topics {
		s.leaveLocked(ss, t)
	}
	delete(s.byID, ss.id)
}
