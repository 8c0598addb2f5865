package signaling

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ClientConfig configures Dial. Key is required.
type ClientConfig struct {
	// Key is the identity key whose peer ID the client proves.
	Key crypto.PrivKey
	// HTTPClient dials the WebSocket (default http.DefaultClient).
	HTTPClient *http.Client
	// PingInterval is how often the client pings to stay under the
	// server's idle timeout (default a third of the announced timeout).
	PingInterval time.Duration
	// Incoming bounds the queue of relayed messages and events not yet
	// taken from Incoming (default 256). While it is full the client stops
	// reading from the server, which eventually drops it as a slow
	// consumer: drain Incoming promptly.
	Incoming int
	// MaxMessageBytes bounds one message from the server (default 1 MiB).
	MaxMessageBytes int64
	// Logger (default: discard).
	Logger *slog.Logger
}

// Client is an authenticated signaling session. Its methods are safe for
// concurrent use.
type Client struct {
	cfg      ClientConfig
	ws       *websocket.Conn
	id       peer.ID
	limits   Limits
	log      *slog.Logger
	incoming chan *Message

	ctx    context.Context // ends the loops
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	err    error // set before done is closed
	once   sync.Once

	mu      sync.Mutex
	nextReq uint64
	pending map[uint64]chan *Message
}

// Dial connects to a signaling server at url (ws:// or wss://, normally
// ending in Path) and authenticates with cfg.Key. It returns once the
// server has accepted the ID.
func Dial(ctx context.Context, url string, cfg ClientConfig) (*Client, error) {
	if cfg.Key == nil {
		return nil, errors.New("signaling: dial: no key")
	}
	if cfg.Incoming <= 0 {
		cfg.Incoming = 256
	}
	if cfg.MaxMessageBytes <= 0 {
		cfg.MaxMessageBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	id, err := peer.IDFromPrivateKey(cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("signaling: dial: %w", err)
	}
	ws, resp, err := websocket.Dial(ctx, url, dialOptions(cfg))
	if err != nil {
		if e := refusal(resp); e != nil {
			return nil, fmt.Errorf("signaling: dial %s: %w", url, e)
		}
		return nil, fmt.Errorf("signaling: dial %s: %w", url, err)
	}
	ws.SetReadLimit(cfg.MaxMessageBytes)
	limits, err := handshake(ctx, ws, id, cfg.Key)
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	cctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		cfg:      cfg,
		ws:       ws,
		id:       id,
		limits:   limits,
		log:      cfg.Logger,
		incoming: make(chan *Message, cfg.Incoming),
		ctx:      cctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		pending:  make(map[uint64]chan *Message),
	}
	ping := cfg.PingInterval
	if ping <= 0 {
		ping = 15 * time.Second
		if limits.IdleTimeoutMS > 0 {
			ping = time.Duration(limits.IdleTimeoutMS) * time.Millisecond / 3
		}
	}
	c.wg.Add(2)
	go c.readLoop()
	go c.pingLoop(ping)
	return c, nil
}

// refusal reads why the server refused the upgrade: its body's first line
// is "code: reason" (PROTOCOL.md, "Errors and limits"). A 503 or 429
// without a known code is taken as server_full or addr_full.
func refusal(resp *http.Response) *Error {
	if resp == nil || (resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests) {
		return nil
	}
	var body []byte
	if resp.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 1024))
	}
	line, _, _ := strings.Cut(string(body), "\n")
	code, reason, _ := strings.Cut(line, ": ")
	if _, ok := codeErr[code]; !ok {
		code, reason = CodeServerFull, trim(line)
		if resp.StatusCode == http.StatusTooManyRequests {
			code = CodeAddrFull
		}
	}
	return &Error{Code: code, Reason: trim(reason)}
}

func handshake(ctx context.Context, ws *websocket.Conn, id peer.ID, key crypto.PrivKey) (Limits, error) {
	ch, err := readMessage(ctx, ws)
	if err != nil {
		return Limits{}, err
	}
	if ch.Type != TypeChallenge {
		return Limits{}, fmt.Errorf("signaling: expected challenge, got %q: %w", ch.Type, ErrBadMessage)
	}
	if ch.V != Version {
		return Limits{}, fmt.Errorf("signaling: server speaks version %d, we speak %d: %w", ch.V, Version, ErrVersion)
	}
	sig, err := key.Sign(AuthPayload(ch.Nonce))
	if err != nil {
		return Limits{}, fmt.Errorf("signaling: sign challenge: %w", err)
	}
	auth := &Message{Type: TypeAuth, V: Version, ID: id.String(), Sig: sig}
	if _, err := id.ExtractPublicKey(); err != nil {
		if auth.PubKey, err = crypto.MarshalPublicKey(key.GetPublic()); err != nil {
			return Limits{}, err
		}
	}
	if err := writeMessage(ctx, ws, auth); err != nil {
		return Limits{}, err
	}
	w, err := readMessage(ctx, ws)
	if err != nil {
		return Limits{}, err
	}
	if w.Type != TypeWelcome || w.ID != id.String() {
		return Limits{}, fmt.Errorf("signaling: expected welcome for %s, got %q: %w", id, w.Type, ErrBadMessage)
	}
	var l Limits
	if ch.Limits != nil {
		l = *ch.Limits
	}
	return l, nil
}

func readMessage(ctx context.Context, ws *websocket.Conn) (*Message, error) {
	_, b, err := ws.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("signaling: read: %w", err)
	}
	m, err := DecodeMessage(b)
	if err != nil {
		return nil, err
	}
	if m.Type == TypeError {
		return nil, &Error{Code: m.Code, Reason: m.Reason, Peer: m.Peer}
	}
	return m, nil
}

func writeMessage(ctx context.Context, ws *websocket.Conn, m *Message) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("signaling: write %s: %w", m.Type, err)
	}
	return nil
}

// ID is the authenticated peer ID.
func (c *Client) ID() peer.ID { return c.id }

// Limits are the limits the server announced.
func (c *Client) Limits() Limits { return c.limits }

// Incoming delivers relayed messages (offer, answer, candidate, bye, with
// From set), topic events (joined, left) and errors that answer no pending
// request (for example unknown_peer after Send). It is closed when the
// session ends.
func (c *Client) Incoming() <-chan *Message { return c.incoming }

// Done is closed when the session has ended; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the session ended, or nil while it is open.
func (c *Client) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Join joins topic and returns the other peers in it.
func (c *Client) Join(ctx context.Context, topic string) ([]peer.ID, error) {
	if err := CheckTopic(topic); err != nil {
		return nil, fmt.Errorf("signaling: join: %w", err)
	}
	r, err := c.request(ctx, &Message{Type: TypeJoin, Topic: topic})
	if err != nil {
		return nil, err
	}
	return decodeIDs(r.Peers)
}

// Peers returns the peers in topic other than this client.
func (c *Client) Peers(ctx context.Context, topic string) ([]peer.ID, error) {
	r, err := c.request(ctx, &Message{Type: TypePeers, Topic: topic})
	if err != nil {
		return nil, err
	}
	return decodeIDs(r.Peers)
}

// Leave leaves topic.
func (c *Client) Leave(ctx context.Context, topic string) error {
	_, err := c.request(ctx, &Message{Type: TypeLeave, Topic: topic})
	return err
}

// Send relays m (offer, answer, candidate or bye, with To, SID and Data
// set) to its peer. It returns once m is written; a delivery failure
// arrives later on Incoming as an error with m's Req.
func (c *Client) Send(ctx context.Context, m *Message) error {
	if !IsRelay(m.Type) {
		return fmt.Errorf("signaling: send: %q is not relayed", m.Type)
	}
	c.mu.Lock()
	c.nextReq++
	m.Req = c.nextReq
	c.mu.Unlock()
	return c.write(ctx, m)
}

// clientWriteTimeout bounds one write to the server. A write that takes
// longer means the connection is gone.
const clientWriteTimeout = 10 * time.Second

// write sends m. The caller's ctx is checked first but never reaches the
// websocket: coder/websocket closes the whole connection when a write's
// context ends (even one already ended), so one offer abandoned at its
// deadline would cut this client off from the server and every exchange
// on it. A write is bounded by clientWriteTimeout instead.
func (c *Client) write(ctx context.Context, m *Message) error {
	select {
	case <-c.done:
		return c.closedErr()
	case <-ctx.Done():
		return ctx.Err()
	default:
	}
	wctx, cancel := context.WithTimeout(c.ctx, clientWriteTimeout)
	defer cancel()
	return writeMessage(wctx, c.ws, m)
}

func (c *Client) closedErr() error {
	if c.err != nil {
		return fmt.Errorf("%w: %w", ErrClosed, c.err)
	}
	return ErrClosed
}

func (c *Client) request(ctx context.Context, m *Message) (*Message, error) {
	ch := make(chan *Message, 1)
	c.mu.Lock()
	c.nextReq++
	m.Req = c.nextReq
	c.pending[m.Req] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, m.Req)
		c.mu.Unlock()
	}()
	if err := c.write(ctx, m); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		if r.Type == TypeError {
			return nil, &Error{Code: r.Code, Reason: r.Reason, Peer: r.Peer}
		}
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, c.closedErr()
	}
}

func (c *Client) readLoop() {
	defer c.wg.Done()
	var err error
	defer func() { c.finish(err) }()
	for {
		var b []byte
		_, b, err = c.ws.Read(c.ctx)
		if err != nil {
			return
		}
		m, derr := DecodeMessage(b)
		if derr != nil {
			c.log.Warn("signaling: dropped a bad message from the server", "err", derr)
			continue
		}
		if m.Req != 0 {
			c.mu.Lock()
			ch, ok := c.pending[m.Req]
			c.mu.Unlock()
			if ok {
				ch <- m // buffered, one answer per request
				continue
			}
		}
		switch m.Type {
		case TypePong:
			continue
		case TypeError:
			if m.Req == 0 {
				// Sent just before the server closes: keep it as the reason.
				c.mu.Lock()
				c.err = &Error{Code: m.Code, Reason: m.Reason, Peer: m.Peer}
				c.mu.Unlock()
				continue
			}
		}
		select {
		case c.incoming <- m:
		case <-c.ctx.Done():
			return
		}
	}
}

// finish records why the session ended (the server's last error message if
// it sent one) and releases everyone waiting.
func (c *Client) finish(err error) {
	c.once.Do(func() {
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
		close(c.done)
		close(c.incoming)
		c.cancel()
	})
}

func (c *Client) pingLoop(every time.Duration) {
	defer c.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			ctx, cancel := context.WithTimeout(c.ctx, every)
			err := c.write(ctx, &Message{Type: TypePing})
			cancel()
			if err != nil {
				c.log.Debug("signaling: ping", "err", err)
			}
		case <-c.ctx.Done():
			return
		}
	}
}

// Close ends the session and waits for the client's goroutines.
func (c *Client) Close() error {
	c.ws.Close(websocket.StatusNormalClosure, "bye")
	c.cancel()
	c.wg.Wait()
	return nil
}

func decodeIDs(ss []string) ([]peer.ID, error) {
	out := make([]peer.ID, 0, len(ss))
	for _, s := range ss {
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("signaling: peer list: %w", err)
		}
		out = append(out, id)
	}
	return out, nil
}
