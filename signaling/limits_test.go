package signaling

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
)

func TestConfigDefaults(t *testing.T) {
	got := NewServer(Config{}).Limits()
	want := Limits{
		MaxMessageBytes: 64 << 10, MessagesPerSecond: 50, Burst: 200,
		MaxPeersPerTopic: 1024, MaxTopics: 16, IdleTimeoutMS: 60000,
		AuthTimeoutMS: 5000, TopicJoinsPerSecond: 0.2, TopicJoinBurst: 32,
		SendQueueBytes: 1 << 20,
	}
	if got != want {
		t.Fatalf("default limits = %+v; want %+v", got, want)
	}
	c := Config{}.withDefaults()
	if c.MaxConns != 4096 || c.MaxConnsPerAddr != 64 || c.MaxPendingLogins != 256 ||
		c.SendQueue != 256 || c.MaxQueuedBytes != 256<<20 || c.RelayToAnyPeer {
		t.Fatalf("defaults = %+v", c)
	}
	if c := (Config{MaxConns: 10, MaxConnsPerAddr: -1}).withDefaults(); c.MaxPendingLogins != 10 || c.MaxConnsPerAddr != -1 {
		t.Fatalf("MaxPendingLogins = %d, MaxConnsPerAddr = %d; want 10 (MaxConns), -1 (no limit)", c.MaxPendingLogins, c.MaxConnsPerAddr)
	}
}

func TestAddrKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"192.0.2.7:4000", "192.0.2.7"},
		{"192.0.2.7", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:4000", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:4000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1%eth0]:4000", "2001:db8:1:2::/64"},
		{"[::1]:80", "::/64"},
		{"@unix", "@unix"},
	} {
		if got := addrKey(tc.in); got != tc.want {
			t.Errorf("addrKey(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// fromAddr returns an HTTP client whose connections leave from ip (any
// 127.0.0.0/8 address is loopback on Linux).
func fromAddr(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

func dialFrom(t *testing.T, url, ip string) (*Client, error) {
	t.Helper()
	c, err := Dial(ctxT(t), url, ClientConfig{Key: newKey(t), HTTPClient: fromAddr(ip)})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// One address cannot take every slot: past MaxConnsPerAddr its sessions
// are refused (HTTP 429, addr_full) while other addresses still get in.
func TestConnsPerAddr(t *testing.T) {
	s, url := newTestServer(t, Config{MaxConns: 8, MaxConnsPerAddr: 3})
	var mine []*Client
	for i := 0; i < 3; i++ {
		c, err := dialFrom(t, url, "127.0.0.1")
		if err != nil {
			t.Fatalf("session %d from 127.0.0.1: %v", i, err)
		}
		mine = append(mine, c)
	}
	if _, err := dialFrom(t, url, "127.0.0.1"); !errors.Is(err, ErrAddrFull) {
		t.Fatalf("4th session from 127.0.0.1: %v; want ErrAddrFull", err)
	}
	if _, err := dialFrom(t, url, "127.0.0.2"); err != nil {
		t.Fatalf("session from 127.0.0.2: %v", err)
	}
	if n := s.Stats().Rejected[CodeAddrFull]; n != 1 {
		t.Fatalf("addr_full counter = %d; want 1", n)
	}
	// A slot given back can be taken again.
	mine[0].Close()
	waitUntil(t, func() bool { return s.Stats().Connections == 3 })
	if _, err := dialFrom(t, url, "127.0.0.1"); err != nil {
		t.Fatalf("session from 127.0.0.1 after one closed: %v", err)
	}
}

// Sessions that never log in hold at most MaxPendingLogins slots; logged-in
// sessions do not count against it.
func TestPendingLogins(t *testing.T) {
	s, url := newTestServer(t, Config{MaxConns: 8, MaxPendingLogins: 2, MaxConnsPerAddr: -1})
	for i := 0; i < 3; i++ {
		dial(t, url, newKey(t)) // logged in: no pending slot held
	}
	silent, ch := rawDial(t, url)
	rawDial(t, url)
	if _, err := Dial(ctxT(t), url, ClientConfig{Key: newKey(t)}); !errors.Is(err, ErrLoginsFull) {
		t.Fatalf("dial with 2 sessions logging in: %v; want ErrLoginsFull", err)
	}
	if n := s.Stats().Rejected[CodeLoginsFull]; n != 1 {
		t.Fatalf("logins_full counter = %d; want 1", n)
	}
	// Once one of them logs in, its slot is free.
	k := newKey(t)
	id, _ := peer.IDFromPrivateKey(k)
	silent.send(authMsg(id, k, ch.Nonce))
	if w := silent.read(); w == nil || w.Type != TypeWelcome {
		t.Fatalf("welcome = %+v", w)
	}
	dial(t, url, newKey(t))
}

// smallBufListener makes the server's socket send buffers small, so that
// a client that does not read blocks the server's writes after a few KiB
// instead of the megabytes that loopback autotuning allows.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(4096)
	}
	return c, err
}

func newSmallBufServer(t *testing.T, cfg Config) (*Server, string) {
	t.Helper()
	s := NewServer(cfg)
	hs := httptest.NewUnstartedServer(s)
	hs.Listener = smallBufListener{hs.Listener}
	hs.Start()
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	return s, "ws" + strings.TrimPrefix(hs.URL, "http") + Path
}

// newSink logs in a client that then never reads, with a small receive
// buffer, and joins topic.
func newSink(t *testing.T, url, topic string) peer.ID {
	t.Helper()
	d := &net.Dialer{Control: nil}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetReadBuffer(4096)
		}
		return c, err
	}}}
	ws, _, err := websocket.Dial(ctxT(t), url, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	t.Cleanup(func() { ws.CloseNow() })
	r := &rawConn{t: t, ws: ws}
	ch := r.read()
	k := newKey(t)
	id, _ := peer.IDFromPrivateKey(k)
	r.send(authMsg(id, k, ch.Nonce))
	if w := r.read(); w == nil || w.Type != TypeWelcome {
		t.Fatalf("welcome = %+v", w)
	}
	r.send(map[string]any{"type": "join", "topic": topic})
	if p := r.read(); p == nil || p.Type != TypePeers {
		t.Fatalf("join answer = %+v", p)
	}
	return id
}

// flood sends offers of size bytes to the sinks in turn until stop
// reports true, at most n of them, pausing pause between them. The
// flooder's incoming messages are drained.
func flood(t *testing.T, f *Client, sinks []peer.ID, size, n int, pause time.Duration, stop func() bool) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range f.Incoming() {
		}
	}()
	defer func() {
		f.Close()
		wg.Wait()
	}()
	payload := json.RawMessage(`"` + strings.Repeat("x", size) + `"`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < n && !stop() && ctx.Err() == nil; i++ {
		if err := f.Send(ctx, &Message{Type: TypeOffer, To: sinks[i%len(sinks)].String(), SID: "s", Data: payload}); err != nil {
			t.Fatalf("flood: %v", err)
		}
		time.Sleep(pause)
	}
}

// fast lifts the message rate limit for floods.
func fast(cfg Config) Config {
	cfg.MessagesPerSecond, cfg.Burst = 1e6, 1e6
	return cfg
}

// The byte bound of one queue: a client that does not read is dropped once
// its queue holds SendQueueBytes, however few messages that is, and the
// drop is counted.
func TestSendQueueBytes(t *testing.T) {
	const limit = 64 << 10
	s, url := newSmallBufServer(t, fast(Config{SendQueue: 100000, SendQueueBytes: limit, WriteTimeout: time.Minute}))
	sink := newSink(t, url, "t")
	f := dial(t, url, newKey(t))
	joinAll(t, "t", f)
	dropped := func() bool { return s.Stats().Rejected[CodeSlowConsumer] > 0 }
	flood(t, f, []peer.ID{sink}, 8000, 2000, 0, dropped)
	st := s.Stats()
	if st.Dropped[DropQueueBytes] != 1 || st.Rejected[CodeSlowConsumer] != 1 {
		t.Fatalf("dropped = %v, slow_consumer = %d; want 1 queue_bytes drop", st.Dropped, st.Rejected[CodeSlowConsumer])
	}
	// What the sink's queue held, plus a few small answers to the flooder.
	if st.QueuedBytesPeak > limit+4096 {
		t.Fatalf("queued bytes peaked at %d; want at most %d", st.QueuedBytesPeak, limit+4096)
	}
}

// The global byte bound: many clients that do not read cannot make the
// server hold more than MaxQueuedBytes; the largest queues are dropped,
// and a client that reads is not.
func TestMaxQueuedBytes(t *testing.T) {
	const global = 96 << 10
	s, url := newSmallBufServer(t, fast(Config{SendQueue: 100000, SendQueueBytes: 1 << 20, MaxQueuedBytes: global, WriteTimeout: time.Minute}))
	sinks := []peer.ID{newSink(t, url, "t"), newSink(t, url, "t"), newSink(t, url, "t")}
	bystander := dial(t, url, newKey(t))
	f := dial(t, url, newKey(t))
	joinAll(t, "t", bystander, f)
	go func() {
		for range bystander.Incoming() {
		}
	}()
	dropped := func() bool { return s.Stats().Dropped[DropGlobalBytes] > 0 }
	flood(t, f, sinks, 8000, 2000, 0, dropped)
	st := s.Stats()
	if st.Dropped[DropGlobalBytes] == 0 || st.Dropped[DropQueueBytes] != 0 {
		t.Fatalf("dropped = %v; want global_bytes drops only", st.Dropped)
	}
	if st.QueuedBytesPeak > global {
		t.Fatalf("queued bytes peaked at %d; want at most %d", st.QueuedBytesPeak, global)
	}
	if _, err := bystander.Peers(ctxT(t), "t"); err != nil {
		t.Fatalf("bystander: %v", err)
	}
}

// A client dropped because a write to it timed out is counted as a slow
// consumer too.
func TestWriteTimeoutIsCounted(t *testing.T) {
	s, url := newSmallBufServer(t, fast(Config{SendQueue: 100000, SendQueueBytes: 64 << 20, WriteTimeout: 200 * time.Millisecond}))
	sink := newSink(t, url, "t")
	f := dial(t, url, newKey(t))
	joinAll(t, "t", f)
	dropped := func() bool { return s.Stats().Rejected[CodeSlowConsumer] > 0 }
	flood(t, f, []peer.ID{sink}, 8000, 2000, 5*time.Millisecond, dropped)
	st := s.Stats()
	if st.Dropped[DropWriteTimeout] != 1 || st.Rejected[CodeSlowConsumer] != 1 {
		t.Fatalf("dropped = %v, slow_consumer = %d; want 1 write_timeout drop", st.Dropped, st.Rejected[CodeSlowConsumer])
	}
	waitUntil(t, func() bool { return s.Stats().QueuedBytes == 0 })
}

// Join/leave loops are bounded by the join rate: every join and leave sends
// an event to each member.
func TestTopicJoinRate(t *testing.T) {
	now := time.Unix(1000, 0) // frozen clock: no tokens come back
	s, url := newTestServer(t, Config{TopicJoinBurst: 3, Now: func() time.Time { return now }})
	member := dial(t, url, newKey(t))
	joinAll(t, "t", member)
	churner := dial(t, url, newKey(t))
	ctx := ctxT(t)
	joined := 0
	for i := 0; i < 6; i++ {
		_, err := churner.Join(ctx, "t")
		if err == nil {
			joined++
			// Joining a topic one is in is free.
			if _, err := churner.Join(ctx, "t"); err != nil {
				t.Fatalf("join %d again: %v", i, err)
			}
		} else if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("join %d: %v; want ok or ErrRateLimited", i, err)
		}
		if err := churner.Leave(ctx, "t"); err != nil {
			t.Fatalf("leave %d: %v", i, err)
		}
	}
	if joined != 3 {
		t.Fatalf("%d of 6 joins accepted; want 3 (the burst)", joined)
	}
	if n := s.Stats().Events; n != 6 {
		t.Fatalf("%d membership events; want 6 (3 joined, 3 left)", n)
	}
}

// Offers, answers, candidates and byes go only to peers of a shared topic
// (unless Config.RelayToAnyPeer); outside one, the target looks absent.
func TestRelayNeedsSharedTopic(t *testing.T) {
	offer := func(from, to *Client) *Message {
		t.Helper()
		if err := from.Send(ctxT(t), &Message{Type: TypeOffer, To: to.ID().String(), SID: "s", Data: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		// A ping answered after the relay says it was handled.
		if _, err := from.request(ctxT(t), &Message{Type: TypePing}); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case m := <-from.Incoming():
				if m.Type == TypeError {
					return m
				}
			default:
				return nil
			}
		}
	}
	s, url := newTestServer(t, Config{})
	a, b := dial(t, url, newKey(t)), dial(t, url, newKey(t))
	joinAll(t, "t", a)
	joinAll(t, "u", b)
	if m := offer(a, b); m == nil || m.Code != CodeUnknownPeer || m.Peer != b.ID().String() {
		t.Fatalf("offer without a shared topic: %+v; want unknown_peer", m)
	}
	joinAll(t, "t", b)
	if m := offer(a, b); m != nil {
		t.Fatalf("offer in a shared topic: %+v; want no error", m)
	}
	next(t, b, TypeOffer)
	if err := b.Leave(ctxT(t), "t"); err != nil {
		t.Fatal(err)
	}
	if m := offer(b, a); m == nil || m.Code != CodeUnknownPeer {
		t.Fatalf("offer after leaving: %+v; want unknown_peer", m)
	}
	if st := s.Stats(); st.Relayed != 1 || st.Rejected[CodeUnknownPeer] != 2 {
		t.Fatalf("relayed %d, unknown_peer %d; want 1, 2", st.Relayed, st.Rejected[CodeUnknownPeer])
	}

	_, url = newTestServer(t, Config{RelayToAnyPeer: true})
	a, b = dial(t, url, newKey(t)), dial(t, url, newKey(t))
	if m := offer(a, b); m != nil {
		t.Fatalf("offer with RelayToAnyPeer: %+v; want no error", m)
	}
	next(t, b, TypeOffer)
}

// Only Ed25519 identities log in.
func TestAuthOnlyEd25519(t *testing.T) {
	secp, _, _ := crypto.GenerateSecp256k1Key(rand.Reader)
	ecdsa, _, _ := crypto.GenerateECDSAKeyPair(rand.Reader)
	s, url := newTestServer(t, Config{})
	for _, tc := range []struct {
		name string
		key  crypto.PrivKey
	}{{"secp256k1", secp}, {"ecdsa", ecdsa}} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Dial(ctxT(t), url, ClientConfig{Key: tc.key})
			if !errors.Is(err, ErrAuth) {
				t.Fatalf("dial with a %s key: %v; want ErrAuth", tc.name, err)
			}
		})
	}
	if n := s.Stats().Rejected[CodeAuthFailed]; n != 2 {
		t.Fatalf("auth_failed counter = %d; want 2", n)
	}
	// An Ed25519 ID with its key repeated in "pub" is fine; another key is not.
	k := newKey(t)
	id, _ := peer.IDFromPrivateKey(k)
	m := &Message{Type: TypeAuth, V: Version, ID: id.String(), Sig: sign(t, k, make([]byte, NonceSize))}
	m.PubKey, _ = crypto.MarshalPublicKey(k.GetPublic())
	if got, err := VerifyAuth(m, make([]byte, NonceSize)); err != nil || got != id {
		t.Fatalf("VerifyAuth with pub = %v, %v; want %v", got, err, id)
	}
	m.PubKey, _ = crypto.MarshalPublicKey(newKey(t).GetPublic())
	if _, err := VerifyAuth(m, make([]byte, NonceSize)); err == nil {
		t.Fatal("VerifyAuth accepted a pub that is not the ID's key")
	}
}

func sign(t *testing.T, k crypto.PrivKey, nonce []byte) []byte {
	t.Helper()
	sig, err := k.Sign(AuthPayload(nonce))
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// The metric names are an interface: dashboards use them.
func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewServer(Config{}))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := make(map[string]bool)
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, name := range []string{
		"rdrr_signal_connections", "rdrr_signal_accepted_total", "rdrr_signal_authenticated_total",
		"rdrr_signal_relayed_total", "rdrr_signal_rejected_total", "rdrr_signal_events_total",
		"rdrr_signal_dropped_total", "rdrr_signal_queued_bytes", "rdrr_signal_queued_bytes_peak",
	} {
		if !have[name] {
			t.Errorf("metric %s missing", name)
		}
	}
}
