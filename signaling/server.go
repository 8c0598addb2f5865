package signaling

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/libp2p/go-libp2p/core/crypto"
	cryptopb "github.com/libp2p/go-libp2p/core/crypto/pb"
	"github.com/libp2p/go-libp2p/core/peer"
	"golang.org/x/time/rate"
)

// Config configures a Server. Zero values take the documented defaults;
// PROTOCOL.md ("Errors and limits") lists the same defaults for clients.
type Config struct {
	// MaxMessageBytes is the largest message accepted from a client
	// (default 64 KiB; an SDP offer with its signature is a few KiB).
	MaxMessageBytes int
	// MessagesPerSecond and Burst bound each client's message rate (token
	// bucket; defaults 50/s and 200).
	MessagesPerSecond float64
	Burst             int
	// TopicJoinsPerSecond and TopicJoinBurst bound how often one client
	// may enter a topic (token bucket; defaults 0.2/s, that is one join
	// every 5 s, and a burst of twice MaxTopics). Each join and each leave
	// sends an event to every member, so join/leave loops would otherwise
	// cost members*MessagesPerSecond events a second. Leaving is never
	// refused; re-joining a topic one is in is free.
	TopicJoinsPerSecond float64
	TopicJoinBurst      int
	// MaxPeersPerTopic bounds a topic's members (default 1024).
	MaxPeersPerTopic int
	// MaxTopics bounds the topics one client is in at once (default 16).
	MaxTopics int
	// MaxConns bounds open WebSocket sessions; more are refused with HTTP
	// 503 before the upgrade (default 4096).
	MaxConns int
	// MaxConnsPerAddr bounds the open sessions from one client address
	// (an IPv4 address or an IPv6 /64; see ClientAddr); more are refused
	// with HTTP 429 (default 64; negative: no limit). Tests that run many
	// clients on loopback raise it.
	MaxConnsPerAddr int
	// MaxPendingLogins bounds the sessions that have not authenticated yet;
	// more are refused with HTTP 503 (default 256, at most MaxConns), so
	// that sessions which never log in cannot hold every slot.
	MaxPendingLogins int
	// ClientAddr returns the address that MaxConnsPerAddr counts for r, as
	// "ip" or "ip:port" (default r.RemoteAddr). Behind a reverse proxy,
	// return the client address the proxy forwards (and that only the
	// proxy can set); otherwise every client counts as the proxy.
	ClientAddr func(r *http.Request) string
	// IdleTimeout closes an authenticated client that sent nothing for this
	// long (default 60s; clients send "ping" at a third of it).
	IdleTimeout time.Duration
	// AuthTimeout closes a client that has not authenticated this long
	// after connecting (default 5s: one round trip and one signature).
	AuthTimeout time.Duration
	// WriteTimeout bounds one write to a client; a client that does not
	// take a message in this long is dropped as a slow consumer (default
	// 10s).
	WriteTimeout time.Duration
	// SendQueue and SendQueueBytes bound the messages queued for one
	// client (defaults 256 messages and 1 MiB, counting the message being
	// written); a client whose queue is full is disconnected as a slow
	// consumer. A message always fits in an empty queue.
	SendQueue      int
	SendQueueBytes int64
	// MaxQueuedBytes bounds the send queues of all clients together
	// (default 256 MiB). When a message would pass it, the clients with
	// the largest queues are disconnected as slow consumers until it fits.
	MaxQueuedBytes int64
	// MaxStrikes is how many refused messages (malformed, rate limited) a
	// client may send before it is disconnected (default 32).
	MaxStrikes int
	// RelayToAnyPeer relays offers, answers, candidates and byes to any
	// connected peer. By default (false) the sender and the target must
	// share a topic, so that a client can only be contacted by peers of
	// the topics it chose to join.
	RelayToAnyPeer bool
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
	def(&c.TopicJoinBurst, 2*c.MaxTopics)
	def(&c.MaxConns, 4096)
	if c.MaxConnsPerAddr == 0 {
		c.MaxConnsPerAddr = 64
	}
	def(&c.MaxPendingLogins, 256)
	c.MaxPendingLogins = min(c.MaxPendingLogins, c.MaxConns)
	def(&c.SendQueue, 256)
	def(&c.MaxStrikes, 32)
	if c.MessagesPerSecond <= 0 {
		c.MessagesPerSecond = 50
	}
	if c.TopicJoinsPerSecond <= 0 {
		c.TopicJoinsPerSecond = 0.2
	}
	if c.SendQueueBytes <= 0 {
		c.SendQueueBytes = 1 << 20
	}
	if c.MaxQueuedBytes <= 0 {
		c.MaxQueuedBytes = 256 << 20
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&c.IdleTimeout, 60*time.Second)
	defDur(&c.AuthTimeout, 5*time.Second)
	defDur(&c.WriteTimeout, 10*time.Second)
	if c.ClientAddr == nil {
		c.ClientAddr = func(r *http.Request) string { return r.RemoteAddr }
	}
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

	mu      sync.Mutex
	closed  bool
	byID    map[peer.ID]*session
	topics  map[string]map[peer.ID]*session
	perAddr map[string]int // open sessions by addrKey
	pending int            // sessions not authenticated yet

	// all holds every session, for choosing whom to drop when the queues
	// together are over budget. regMu is taken after mu, never before.
	regMu sync.Mutex
	all   map[*session]struct{}
}

// NewServer returns a server with cfg's limits.
func NewServer(cfg Config) *Server {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	tick := min(cfg.IdleTimeout, cfg.AuthTimeout) / 4
	tick = max(tick, 5*time.Millisecond)
	return &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		tick:    tick,
		ctx:     ctx,
		cancel:  cancel,
		byID:    make(map[peer.ID]*session),
		topics:  make(map[string]map[peer.ID]*session),
		perAddr: make(map[string]int),
		all:     make(map[*session]struct{}),
	}
}

// Limits returns the limits announced to clients.
func (s *Server) Limits() Limits {
	return Limits{
		MaxMessageBytes:     s.cfg.MaxMessageBytes,
		MessagesPerSecond:   s.cfg.MessagesPerSecond,
		Burst:               s.cfg.Burst,
		MaxPeersPerTopic:    s.cfg.MaxPeersPerTopic,
		MaxTopics:           s.cfg.MaxTopics,
		IdleTimeoutMS:       s.cfg.IdleTimeout.Milliseconds(),
		AuthTimeoutMS:       s.cfg.AuthTimeout.Milliseconds(),
		TopicJoinsPerSecond: s.cfg.TopicJoinsPerSecond,
		TopicJoinBurst:      s.cfg.TopicJoinBurst,
		SendQueueBytes:      s.cfg.SendQueueBytes,
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

// addrKey is what MaxConnsPerAddr counts: the IP address, or for IPv6 its
// /64 (one host or LAN commonly holds a whole /64). An address that does
// not parse counts as itself.
func addrKey(remote string) string {
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		a = ap.Addr()
	} else if a, err = netip.ParseAddr(remote); err != nil {
		return remote
	}
	a = a.Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// admit takes a session slot for an address, or returns the code that
// refuses it.
func (s *Server) admit(addr string) (code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return CodeShuttingDown
	case s.stats.open.Load() >= int64(s.cfg.MaxConns):
		return CodeServerFull
	case s.cfg.MaxConnsPerAddr > 0 && s.perAddr[addr] >= s.cfg.MaxConnsPerAddr:
		return CodeAddrFull
	case s.pending >= s.cfg.MaxPendingLogins:
		return CodeLoginsFull
	}
	s.perAddr[addr]++
	s.pending++
	s.stats.open.Add(1)
	s.wg.Add(1)
	return ""
}

// refuseHTTP answers an upgrade that admit refused. The body's first line
// is "code: reason" (PROTOCOL.md), for native clients; browsers see only
// a failed WebSocket.
func (s *Server) refuseHTTP(w http.ResponseWriter, code string) {
	status, reason := http.StatusServiceUnavailable, ""
	switch code {
	case CodeShuttingDown:
		reason = "server shutting down"
	case CodeServerFull:
		reason = fmt.Sprintf("%d sessions open", s.cfg.MaxConns)
	case CodeAddrFull:
		status, reason = http.StatusTooManyRequests, fmt.Sprintf("%d sessions open from your address", s.cfg.MaxConnsPerAddr)
	case CodeLoginsFull:
		reason = fmt.Sprintf("%d sessions logging in", s.cfg.MaxPendingLogins)
	}
	if code != CodeShuttingDown {
		s.stats.reject(code)
	}
	http.Error(w, code+": "+reason, status)
}

// ServeHTTP upgrades to a WebSocket session and serves it until it ends.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	addr := addrKey(s.cfg.ClientAddr(r))
	if code := s.admit(addr); code != "" {
		s.refuseHTTP(w, code)
		return
	}
	ss := &session{
		srv:     s,
		remote:  r.RemoteAddr,
		addr:    addr,
		pending: true,
		q:       newSendQueue(),
		quit:    make(chan struct{}),
		lim:     rate.NewLimiter(rate.Limit(s.cfg.MessagesPerSecond), s.cfg.Burst),
		joins:   rate.NewLimiter(rate.Limit(s.cfg.TopicJoinsPerSecond), s.cfg.TopicJoinBurst),
		topics:  make(map[string]struct{}),
	}
	s.regMu.Lock()
	s.all[ss] = struct{}{}
	s.regMu.Unlock()
	defer s.wg.Done()
	defer s.stats.open.Add(-1)
	defer s.release(ss)

	opts := &websocket.AcceptOptions{OriginPatterns: s.cfg.OriginPatterns}
	if len(s.cfg.OriginPatterns) == 0 {
		opts.InsecureSkipVerify = true // see Config.OriginPatterns
	}
	ws, err := websocket.Accept(w, r, opts)
	if err != nil {
		return // Accept wrote the HTTP error
	}
	ss.ws = ws
	s.stats.accepted.Add(1)
	// One more byte than the limit, so that our own check (which answers
	// with an error message) fires before the library's.
	ws.SetReadLimit(int64(s.cfg.MaxMessageBytes) + 1)
	ss.lastRead.Store(s.cfg.Now().UnixNano())
	ss.run()
}

// release gives back everything a session held: its ID and topics, its
// address and login slots, its queued bytes.
func (s *Server) release(ss *session) {
	s.stats.addQueued(ss.q.close())
	s.mu.Lock()
	if ss.id != "" && s.byID[ss.id] == ss {
		for t := range ss.topics {
			s.leaveLocked(ss, t)
		}
		delete(s.byID, ss.id)
	}
	if ss.pending {
		ss.pending = false
		s.pending--
	}
	if s.perAddr[ss.addr]--; s.perAddr[ss.addr] <= 0 {
		delete(s.perAddr, ss.addr)
	}
	s.mu.Unlock()
	s.regMu.Lock()
	delete(s.all, ss)
	s.regMu.Unlock()
}

// session is one client connection. The ServeHTTP goroutine reads; one
// writer goroutine writes and enforces timeouts. Fields marked "mu" are
// guarded by srv.mu.
type session struct {
	srv    *Server
	ws     *websocket.Conn
	remote string
	addr   string        // addrKey of the client
	q      *sendQueue    // bounded outbound queue
	quit   chan struct{} // closed once the session must end
	fin    closeInfo     // written before quit is closed
	once   sync.Once
	lim    *rate.Limiter // reader goroutine only
	joins  *rate.Limiter // reader goroutine only
	nonce  []byte        // reader goroutine only

	lastRead atomic.Int64 // unix nanos of the last message read
	authed   atomic.Bool
	strikes  int                 // reader goroutine only
	pending  bool                // mu; holds a MaxPendingLogins slot
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

// drop disconnects a client that does not read what we send it, counts
// why, and frees its queue at once (not when its writer gets to it).
// Safe from any goroutine, with or without srv.mu.
func (ss *session) drop(reason string) {
	s := ss.srv
	if ss.fail(websocket.StatusPolicyViolation, CodeSlowConsumer, "dropped: "+reason) {
		ss.countDrop(reason)
	}
	s.stats.addQueued(ss.q.close())
}

// dropTimedOut is drop for the writer, whose write timed out. The library
// closes the connection on the timeout, so the reader may have ended the
// session first, as if the client had left; the drop is counted then too.
func (ss *session) dropTimedOut() {
	if ss.fail(websocket.StatusPolicyViolation, CodeSlowConsumer, "dropped: "+DropWriteTimeout) {
		ss.countDrop(DropWriteTimeout)
	} else {
		<-ss.quit // closed already; fin is set
		if ss.fin.code == "" {
			ss.countDrop(DropWriteTimeout)
		}
	}
	ss.srv.stats.addQueued(ss.q.close())
}

func (ss *session) countDrop(reason string) {
	s := ss.srv
	s.stats.reject(CodeSlowConsumer)
	s.stats.drop(reason)
	s.log.Info("signaling: slow consumer dropped", "peer", ss.id, "remote", ss.remote, "reason", reason)
}

// send queues m for the client without blocking. A client whose queue is
// full is dropped, and send reports false.
func (ss *session) send(m *Message) bool {
	b, err := m.Encode()
	if err != nil {
		ss.srv.log.Error("signaling: encode", "type", m.Type, "err", err)
		return false
	}
	s := ss.srv
	if !s.reserve(ss, int64(len(b))) {
		return false
	}
	reason := ss.q.push(b, s.cfg.SendQueue, s.cfg.SendQueueBytes)
	if reason == "" {
		s.stats.addQueued(0) // record the peak once the bytes are really queued
		return true
	}
	s.stats.addQueued(-int64(len(b)))
	if reason != "closed" {
		ss.drop(reason)
	}
	return false
}

// reserve counts n more queued bytes for a message to ss. When that would
// pass MaxQueuedBytes, it drops the session with the most queued bytes
// (possibly ss) and tries again. When no queue holds anything (the
// total is in messages being written, which their writers release within
// WriteTimeout), the message is let through: the bound then runs over by at
// most one message per session, and an honest client is never dropped for
// memory that others hold.
func (s *Server) reserve(ss *session, n int64) bool {
	for {
		cur := s.stats.queued.Load()
		if cur+n <= s.cfg.MaxQueuedBytes {
			if s.stats.queued.CompareAndSwap(cur, cur+n) {
				return true
			}
			continue
		}
		victim := s.largestQueue()
		if victim == nil {
			s.stats.addQueued(n)
			return true
		}
		victim.drop(DropGlobalBytes)
		if victim == ss {
			return false
		}
	}
}

// largestQueue returns the live session with the most queued bytes, or
// nil if no queue holds any.
func (s *Server) largestQueue() *session {
	s.regMu.Lock()
	defer s.regMu.Unlock()
	var best *session
	var most int64
	for o := range s.all {
		if n := o.q.queued.Load(); n > most && !o.ended() {
			best, most = o, n
		}
	}
	return best
}

func (ss *session) writeLoop() {
	t := time.NewTicker(ss.srv.tick)
	defer t.Stop()
	for {
		select {
		case <-ss.q.ready:
			for !ss.ended() {
				b, ok := ss.q.pop()
				if !ok {
					break
				}
				err := ss.write(b)
				ss.srv.stats.addQueued(ss.q.done(len(b)))
				if err != nil {
					ss.srv.log.Debug("signaling: write failed", "peer", ss.id, "remote", ss.remote, "err", err)
					if isTimeout(err) {
						ss.dropTimedOut()
					}
					ss.fail(websocket.StatusNormalClosure, "", "")
					ss.ws.CloseNow()
					return
				}
			}
		case <-t.C:
			ss.checkIdle()
		case <-ss.srv.ctx.Done():
			ss.fail(websocket.StatusGoingAway, CodeShuttingDown, "server shutting down")
		case <-ss.quit:
			ss.srv.stats.addQueued(ss.q.close())
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

// isTimeout reports whether a write failed for taking too long: the
// WebSocket library returns the context's error or, when the socket's
// deadline fires first, the socket's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
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
	id, err := VerifyAuth(m, ss.nonce)
	if err != nil {
		fail(CodeAuthFailed, err.Error())
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
	if ss.pending {
		ss.pending = false
		s.pending--
	}
	s.mu.Unlock()
	ss.authed.Store(true)
	s.stats.authed.Add(1)
	s.log.Debug("signaling: authenticated", "peer", id, "remote", ss.remote)
	ss.send(&Message{Type: TypeWelcome, ID: id.String()})
}

// VerifyAuth checks an "auth" message against the nonce of the challenge
// it answers and returns the peer ID it proves. Only Ed25519 identities
// are accepted (PROTOCOL.md, "Session"); the ID embeds the key, and a
// "pub" field, if present, must be that key. It does not check that the
// ID is free.
func VerifyAuth(m *Message, nonce []byte) (peer.ID, error) {
	if m.Type != TypeAuth {
		return "", fmt.Errorf("first message must be auth, not %q", trim(m.Type))
	}
	id, err := peer.Decode(m.ID)
	if err != nil {
		return "", errors.New("bad id")
	}
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return "", errors.New("id does not embed an Ed25519 public key")
	}
	if pub.Type() != cryptopb.KeyType_Ed25519 {
		return "", fmt.Errorf("id has a %v key; only Ed25519 identities are accepted", pub.Type())
	}
	if len(m.PubKey) > 0 {
		sent, err := crypto.UnmarshalPublicKey(m.PubKey)
		if err != nil {
			return "", errors.New("bad pub: " + trim(err.Error()))
		}
		if !sent.Equals(pub) {
			return "", errors.New("pub does not match id")
		}
	}
	ok, err := pub.Verify(AuthPayload(nonce), m.Sig)
	if err != nil || !ok {
		return "", errors.New("signature does not verify for " + id.String())
	}
	return id, nil
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
		if !ss.joins.AllowN(s.cfg.Now(), 1) {
			s.mu.Unlock()
			ss.strike(CodeRateLimited, fmt.Sprintf("more than %g topic joins/s (burst %d)", s.cfg.TopicJoinsPerSecond, s.cfg.TopicJoinBurst), m.Req)
			return
		}
		if members == nil {
			members = make(map[peer.ID]*session)
			s.topics[t] = members
		}
		ev := &Message{Type: TypeJoined, Topic: t, Peer: ss.id.String()}
		for _, o := range members {
			s.stats.events.Add(1)
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
		s.stats.events.Add(1)
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

// sharesTopicLocked reports whether ss and the peer to are members of a
// common topic.
func (s *Server) sharesTopicLocked(ss *session, to peer.ID) bool {
	for t := range ss.topics {
		if _, ok := s.topics[t][to]; ok {
			return true
		}
	}
	return false
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
	if target != nil && !s.cfg.RelayToAnyPeer && !s.sharesTopicLocked(ss, to) {
		// Answered like an absent peer, so that relay cannot probe who is
		// connected outside one's topics.
		target = nil
	}
	s.mu.Unlock()
	if target == nil {
		ss.refuse(CodeUnknownPeer, "peer is not connected or shares no topic with you", m.Req, m.To)
		return
	}
	fwd := &Message{Type: m.Type, From: ss.id.String(), SID: m.SID, Data: m.Data}
	s.stats.relayed.Add(1) // before the send, so a receiver never sees an uncounted message
	if !target.send(fwd) {
		s.stats.relayed.Add(-1)
		ss.refuse(CodeUnknownPeer, "peer does not read its messages and was disconnected", m.Req, m.To)
	}
}
