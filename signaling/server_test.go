package signaling

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// newTestServer runs a Server on 127.0.0.1 and returns its ws:// URL.
func newTestServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	s := NewServer(cfg)
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	return s, "ws" + strings.TrimPrefix(hs.URL, "http") + Path
}

func newKey(t testing.TB) crypto.PrivKey {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func dial(t *testing.T, url string, k crypto.PrivKey) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, url, ClientConfig{Key: k})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// next returns the next incoming message of type typ, skipping others.
func next(t *testing.T, c *Client, typ string) *Message {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case m, ok := <-c.Incoming():
			if !ok {
				t.Fatalf("session ended waiting for %q: %v", typ, c.Err())
			}
			if m.Type == typ {
				return m
			}
		case <-timeout:
			t.Fatalf("no %q message", typ)
		}
	}
}

func TestJoinAndRelay(t *testing.T) {
	s, url := newTestServer(t, Config{})
	a := dial(t, url, newKey(t))
	b := dial(t, url, newKey(t))
	ctx := ctxT(t)

	peers, err := a.Join(ctx, "swarm")
	if err != nil || len(peers) != 0 {
		t.Fatalf("a.Join = %v, %v; want no peers", peers, err)
	}
	peers, err = b.Join(ctx, "swarm")
	if err != nil || len(peers) != 1 || peers[0] != a.ID() {
		t.Fatalf("b.Join = %v, %v; want [%s]", peers, err, a.ID())
	}
	if ev := next(t, a, TypeJoined); ev.Peer != b.ID().String() || ev.Topic != "swarm" {
		t.Fatalf("joined event = %+v", ev)
	}
	if got, _ := a.Peers(ctx, "swarm"); len(got) != 1 || got[0] != b.ID() {
		t.Fatalf("a.Peers = %v; want [%s]", got, b.ID())
	}

	for _, typ := range []string{TypeOffer, TypeCandidate, TypeBye} {
		data := json.RawMessage(`{"sdp":"v=0"}`)
		if err := a.Send(ctx, &Message{Type: typ, To: b.ID().String(), SID: "s1", Data: data}); err != nil {
			t.Fatal(err)
		}
		m := next(t, b, typ)
		if m.From != a.ID().String() || m.SID != "s1" || m.To != "" || string(m.Data) != string(data) {
			t.Fatalf("relayed %s = %+v", typ, m)
		}
	}
	if err := b.Leave(ctx, "swarm"); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, a, TypeLeft); ev.Peer != b.ID().String() {
		t.Fatalf("left event = %+v", ev)
	}
	if st := s.Stats(); st.Relayed != 3 || st.Authed != 2 {
		t.Fatalf("stats = %+v; want 3 relayed, 2 authed", st)
	}
	// Closing a client leaves its topics.
	if _, err := b.Join(ctx, "swarm"); err != nil {
		t.Fatal(err)
	}
	next(t, a, TypeJoined)
	b.Close()
	if ev := next(t, a, TypeLeft); ev.Peer != b.ID().String() {
		t.Fatalf("left event after close = %+v", ev)
	}
}

func TestRelayToUnknownPeer(t *testing.T) {
	s, url := newTestServer(t, Config{})
	a := dial(t, url, newKey(t))
	other, _ := peer.IDFromPrivateKey(newKey(t))
	if err := a.Send(ctxT(t), &Message{Type: TypeOffer, To: other.String(), SID: "x", Data: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	m := next(t, a, TypeError)
	if m.Code != CodeUnknownPeer || m.Peer != other.String() || m.Req == 0 {
		t.Fatalf("error = %+v; want unknown_peer for %s", m, other)
	}
	if n := s.Stats().Rejected[CodeUnknownPeer]; n != 1 {
		t.Fatalf("unknown_peer counter = %d; want 1", n)
	}
}

// rawConn is a hand-driven client for protocol violations.
type rawConn struct {
	t  *testing.T
	ws *websocket.Conn
}

func rawDial(t *testing.T, url string) (*rawConn, *Message) {
	t.Helper()
	ws, _, err := websocket.Dial(ctxT(t), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	r := &rawConn{t: t, ws: ws}
	ch := r.read()
	if ch == nil || ch.Type != TypeChallenge || len(ch.Nonce) != NonceSize || ch.Limits == nil {
		t.Fatalf("challenge = %+v", ch)
	}
	return r, ch
}

func (r *rawConn) send(m any) {
	r.t.Helper()
	b, _ := json.Marshal(m)
	if err := r.ws.Write(ctxT(r.t), websocket.MessageText, b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// read returns the next message, or nil once the connection is closed.
func (r *rawConn) read() *Message {
	r.t.Helper()
	_, b, err := r.ws.Read(ctxT(r.t))
	if err != nil {
		return nil
	}
	m, err := DecodeMessage(b)
	if err != nil {
		r.t.Fatalf("bad message from server: %v", err)
	}
	return m
}

// expectClose reads until the connection closes and returns the last error
// code seen and the close status.
func (r *rawConn) expectClose() (code string, status websocket.StatusCode) {
	r.t.Helper()
	for {
		_, b, err := r.ws.Read(ctxT(r.t))
		if err != nil {
			return code, websocket.CloseStatus(err)
		}
		if m, err := DecodeMessage(b); err == nil && m.Type == TypeError {
			code = m.Code
		}
	}
}

func authMsg(id peer.ID, k crypto.PrivKey, nonce []byte) map[string]any {
	sig, _ := k.Sign(AuthPayload(nonce))
	return map[string]any{"type": "auth", "v": Version, "id": id.String(), "sig": sig}
}

func TestAuthRejected(t *testing.T) {
	victimKey := newKey(t)
	victim, _ := peer.IDFromPrivateKey(victimKey)
	mallory := newKey(t)
	cases := []struct {
		name string
		msg  func(nonce []byte) any // nil: send nothing (auth timeout)
		code string
	}{
		{"signature by another key", func(n []byte) any { return authMsg(victim, mallory, n) }, CodeAuthFailed},
		{"signature of another nonce", func(n []byte) any {
			other := make([]byte, NonceSize)
			return authMsg(victim, victimKey, other)
		}, CodeAuthFailed},
		{"no signature", func(n []byte) any { return map[string]any{"type": "auth", "v": 1, "id": victim.String()} }, CodeAuthFailed},
		{"join before auth", func(n []byte) any { return map[string]any{"type": "join", "topic": "t"} }, CodeAuthFailed},
		{"relay before auth", func(n []byte) any {
			return map[string]any{"type": "offer", "to": victim.String(), "sid": "s", "data": map[string]any{}}
		}, CodeAuthFailed},
		{"not JSON", func(n []byte) any { return json.RawMessage(`{"type":`) }, CodeAuthFailed},
		{"wrong version", func(n []byte) any {
			m := authMsg(victim, victimKey, n)
			m["v"] = 2
			return m
		}, CodeVersion},
		{"pub of another key", func(n []byte) any {
			m := authMsg(victim, mallory, n)
			m["pub"], _ = crypto.MarshalPublicKey(mallory.GetPublic())
			return m
		}, CodeAuthFailed},
		{"silent", nil, CodeIdleTimeout},
	}
	s, url := newTestServer(t, Config{AuthTimeout: 200 * time.Millisecond})
	honest := dial(t, url, newKey(t))
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := s.Stats().Rejected[tc.code]
			r, ch := rawDial(t, url)
			if tc.msg != nil {
				r.send(tc.msg(ch.Nonce))
			}
			code, status := r.expectClose()
			if code != tc.code || status != websocket.StatusPolicyViolation {
				t.Fatalf("got error %q, close %v; want %q, %v", code, status, tc.code, websocket.StatusPolicyViolation)
			}
			if n := s.Stats().Rejected[tc.code]; n != before+1 {
				t.Fatalf("%s counter = %d; want %d", tc.code, n, before+1)
			}
			// Nothing is relayed to an unproven ID.
			honest.Send(ctxT(t), &Message{Type: TypeOffer, To: victim.String(), SID: "s", Data: json.RawMessage(`{}`)})
			if m := next(t, honest, TypeError); m.Code != CodeUnknownPeer {
				t.Fatalf("relay to unproven id: %+v; want unknown_peer", m)
			}
		})
	}
	// The genuine key still authenticates afterwards.
	dial(t, url, victimKey)
}

func TestIDCannotRegisterTwice(t *testing.T) {
	s, url := newTestServer(t, Config{})
	k := newKey(t)
	first := dial(t, url, k)
	_, err := Dial(ctxT(t), url, ClientConfig{Key: k})
	if !errors.Is(err, ErrIDInUse) {
		t.Fatalf("second dial: %v; want ErrIDInUse", err)
	}
	if n := s.Stats().Rejected[CodeIDInUse]; n != 1 {
		t.Fatalf("id_in_use counter = %d", n)
	}
	// The first session keeps its traffic.
	b := dial(t, url, newKey(t))
	joinAll(t, "t", first, b)
	b.Send(ctxT(t), &Message{Type: TypeOffer, To: first.ID().String(), SID: "s", Data: json.RawMessage(`{}`)})
	if m := next(t, first, TypeOffer); m.From != b.ID().String() {
		t.Fatalf("offer = %+v", m)
	}
	// Once it leaves, the ID is free again.
	first.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := Dial(ctxT(t), url, ClientConfig{Key: k})
		if err == nil {
			c.Close()
			break
		}
		if !errors.Is(err, ErrIDInUse) || time.Now().After(deadline) {
			t.Fatalf("dial after close: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLimits(t *testing.T) {
	t.Run("message too large", func(t *testing.T) {
		s, url := newTestServer(t, Config{MaxMessageBytes: 1024})
		c := dial(t, url, newKey(t))
		err := c.Send(ctxT(t), &Message{Type: TypeOffer, To: c.ID().String(), SID: "s",
			Data: json.RawMessage(`"` + strings.Repeat("x", 2000) + `"`)})
		if err != nil {
			t.Fatal(err)
		}
		<-c.Done()
		if !errors.Is(c.Err(), ErrTooLarge) {
			t.Fatalf("session ended with %v; want ErrTooLarge", c.Err())
		}
		if n := s.Stats().Rejected[CodeTooLarge]; n != 1 {
			t.Fatalf("too_large counter = %d", n)
		}
	})
	t.Run("rate", func(t *testing.T) {
		now := time.Unix(1000, 0) // frozen clock: no tokens come back
		s, url := newTestServer(t, Config{MessagesPerSecond: 1, Burst: 3, MaxStrikes: 2, Now: func() time.Time { return now }})
		c := dial(t, url, newKey(t))
		ctx := ctxT(t)
		for i := 0; i < 3; i++ {
			if _, err := c.Peers(ctx, "t"); err != nil {
				t.Fatalf("message %d within burst: %v", i, err)
			}
		}
		if _, err := c.Peers(ctx, "t"); !errors.Is(err, ErrRateLimited) {
			t.Fatalf("over burst: %v; want ErrRateLimited", err)
		}
		c.Peers(ctx, "t")
		c.Peers(ctx, "t")
		<-c.Done()
		if !errors.Is(c.Err(), ErrTooManyErrors) {
			t.Fatalf("session ended with %v; want ErrTooManyErrors", c.Err())
		}
		if n := s.Stats().Rejected[CodeRateLimited]; n != 3 {
			t.Fatalf("rate_limited counter = %d; want 3", n)
		}
	})
	t.Run("peers per topic", func(t *testing.T) {
		_, url := newTestServer(t, Config{MaxPeersPerTopic: 2})
		ctx := ctxT(t)
		for i := 0; i < 2; i++ {
			if _, err := dial(t, url, newKey(t)).Join(ctx, "t"); err != nil {
				t.Fatal(err)
			}
		}
		c := dial(t, url, newKey(t))
		if _, err := c.Join(ctx, "t"); !errors.Is(err, ErrTopicFull) {
			t.Fatalf("third join: %v; want ErrTopicFull", err)
		}
		if _, err := c.Join(ctx, "u"); err != nil {
			t.Fatalf("join of another topic: %v", err)
		}
	})
	t.Run("topics per client", func(t *testing.T) {
		_, url := newTestServer(t, Config{MaxTopics: 2})
		c := dial(t, url, newKey(t))
		ctx := ctxT(t)
		for _, topic := range []string{"a", "b", "a"} {
			if _, err := c.Join(ctx, topic); err != nil {
				t.Fatalf("join %s: %v", topic, err)
			}
		}
		if _, err := c.Join(ctx, "c"); !errors.Is(err, ErrTooManyTopics) {
			t.Fatalf("join c: %v; want ErrTooManyTopics", err)
		}
	})
	t.Run("idle", func(t *testing.T) {
		s, url := newTestServer(t, Config{IdleTimeout: 150 * time.Millisecond})
		k := newKey(t)
		// A client that pings stays; one that does not is closed.
		alive, err := Dial(ctxT(t), url, ClientConfig{Key: newKey(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer alive.Close()
		quiet, err := Dial(ctxT(t), url, ClientConfig{Key: k, PingInterval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer quiet.Close()
		select {
		case <-quiet.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("quiet client not closed")
		}
		if !errors.Is(quiet.Err(), ErrIdle) {
			t.Fatalf("quiet client ended with %v; want ErrIdle", quiet.Err())
		}
		if err := alive.Err(); err != nil {
			t.Fatalf("pinging client ended: %v", err)
		}
		if s.Stats().Rejected[CodeIdleTimeout] != 1 {
			t.Fatalf("idle counter = %d", s.Stats().Rejected[CodeIdleTimeout])
		}
	})
	t.Run("connections", func(t *testing.T) {
		s, url := newTestServer(t, Config{MaxConns: 2})
		dial(t, url, newKey(t))
		dial(t, url, newKey(t))
		if _, err := Dial(ctxT(t), url, ClientConfig{Key: newKey(t)}); !errors.Is(err, ErrServerFull) {
			t.Fatalf("third dial: %v; want ErrServerFull", err)
		}
		if s.Stats().Rejected[CodeServerFull] != 1 || s.Stats().Connections != 2 {
			t.Fatalf("stats = %+v", s.Stats())
		}
	})
	t.Run("malformed", func(t *testing.T) {
		_, url := newTestServer(t, Config{})
		c := dial(t, url, newKey(t))
		// A join without a topic is refused, the session stays.
		if _, err := c.request(ctxT(t), &Message{Type: TypeJoin}); !errors.Is(err, ErrBadMessage) {
			t.Fatalf("join without topic: %v; want ErrBadMessage", err)
		}
		if _, err := c.request(ctxT(t), &Message{Type: "teleport"}); !errors.Is(err, ErrUnknownType) {
			t.Fatalf("unknown type: %v; want ErrUnknownType", err)
		}
		if _, err := c.Peers(ctxT(t), "t"); err != nil {
			t.Fatalf("session after refused messages: %v", err)
		}
	})
}

// A client that stops reading is dropped; the others are not slowed.
func TestSlowConsumerDoesNotStallOthers(t *testing.T) {
	// The write timeout is long: the sink reads its slow_consumer error only
	// at the end, and a write that times out closes the connection before
	// that error can be sent (TestWriteTimeoutIsCounted covers timeouts).
	s, url := newTestServer(t, Config{SendQueue: 4, MessagesPerSecond: 1e6, Burst: 1e6, WriteTimeout: time.Minute})
	flooder := dial(t, url, newKey(t))
	bystander := dial(t, url, newKey(t))
	// The sink authenticates and then never reads again.
	r, ch := rawDial(t, url)
	sinkKey := newKey(t)
	sink, _ := peer.IDFromPrivateKey(sinkKey)
	r.send(authMsg(sink, sinkKey, ch.Nonce))
	if w := r.read(); w == nil || w.Type != TypeWelcome {
		t.Fatalf("welcome = %+v", w)
	}
	r.send(map[string]any{"type": "join", "topic": "t"})
	if p := r.read(); p == nil || p.Type != TypePeers {
		t.Fatalf("join answer = %+v", p)
	}
	joinAll(t, "t", flooder)
	payload := json.RawMessage(`"` + strings.Repeat("x", 60000) + `"`)
	// The flood and the checks after it share a minute; each of the
	// bystander's round trips has its own 10 s, so that a slow one fails
	// on its own bound below, not on a deadline shared with the flood.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	// The flooder reads what comes back (unknown_peer once the sink is
	// gone), so that only the sink is slow.
	wg.Add(2)
	go func() {
		defer wg.Done()
		for range flooder.Incoming() {
		}
	}()
	defer flooder.Close()
	go func() {
		defer wg.Done()
		for i := 0; i < 2000 && ctx.Err() == nil; i++ {
			if flooder.Send(ctx, &Message{Type: TypeOffer, To: sink.String(), SID: "s", Data: payload}) != nil {
				return
			}
			if s.Stats().Rejected[CodeSlowConsumer] > 0 {
				return
			}
		}
	}()
	// Meanwhile the bystander's round trips stay fast: a server that
	// waited on the sink would hold them for the write timeout (a
	// minute); 5 s leaves a loaded 2-core machine room (1.9 s seen).
	for i := 0; i < 20; i++ {
		start := time.Now()
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := bystander.Peers(rctx, "t")
		rcancel()
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("bystander round trip took %v (%v)", d, err)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, func() bool { return s.Stats().Rejected[CodeSlowConsumer] > 0 })
	flooder.Close()
	wg.Wait()
	// The sink was told, and dropped; the bystander is still there. (The
	// flooder may be dropped too: it sends faster than it lets the server
	// answer.)
	if code, status := r.expectClose(); code != CodeSlowConsumer || status != websocket.StatusPolicyViolation {
		t.Fatalf("sink closed with %q, %v; want slow_consumer, 1008", code, status)
	}
	if _, err := bystander.Peers(ctx, "t"); err != nil {
		t.Fatalf("bystander after the flood: %v", err)
	}
}

func TestServerCloseEndsSessions(t *testing.T) {
	s, url := newTestServer(t, Config{})
	c := dial(t, url, newKey(t))
	s.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client not closed")
	}
	if !errors.Is(c.Err(), ErrShuttingDown) {
		t.Fatalf("client ended with %v; want ErrShuttingDown", c.Err())
	}
	if _, err := Dial(ctxT(t), url, ClientConfig{Key: newKey(t)}); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

// joinAll joins every client to topic.
func joinAll(t *testing.T, topic string, cs ...*Client) {
	t.Helper()
	for _, c := range cs {
		if _, err := c.Join(ctxT(t), topic); err != nil {
			t.Fatalf("join %s: %v", topic, err)
		}
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A caller's context that ends around a send must not close the client:
// coder/websocket closes the connection when a write's context ends, and a
// fetch abandons offers at its connect deadline all the time.
func TestEndedContextDoesNotCloseClient(t *testing.T) {
	_, url := newTestServer(t, Config{})
	a, b := dial(t, url, newKey(t)), dial(t, url, newKey(t))
	joinAll(t, "t", a, b)
	for range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err := a.Send(ctx, &Message{Type: TypeOffer, To: b.ID().String(), SID: "s", Data: []byte(`{}`)})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("send with an ended context: %v", err)
		}
	}
	if _, err := a.Peers(ctxT(t), "t"); err != nil {
		t.Fatalf("client after sends with ended contexts: %v", err)
	}
}
