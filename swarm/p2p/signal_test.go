package p2p

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

func newTestSignaler(t *testing.T, h *Host, mod func(*SignalConfig)) *StreamSignaler {
	t.Helper()
	var cfg SignalConfig
	if mod != nil {
		mod(&cfg)
	}
	s := NewStreamSignaler(h, cfg)
	t.Cleanup(func() { s.Close() })
	return s
}

func relay(typ string, to peer.ID, sid, data string) *signaling.Message {
	m := &signaling.Message{Type: typ, To: to.String(), SID: sid}
	if data != "" {
		m.Data = json.RawMessage(data)
	}
	return m
}

func next(t *testing.T, s *StreamSignaler) *signaling.Message {
	t.Helper()
	select {
	case m, ok := <-s.Incoming():
		if !ok {
			t.Fatal("incoming closed")
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
	}
	return nil
}

func TestStreamSignalerInOrder(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa, sb := newTestSignaler(t, a, nil), newTestSignaler(t, b, nil)
	connect(t, a, b)
	sent := []*signaling.Message{
		relay(signaling.TypeOffer, b.ID(), "s1", `{"sdp":"v=0"}`),
	}
	for i := range 50 {
		sent = append(sent, relay(signaling.TypeCandidate, b.ID(), "s1", `{"candidate":"c`+string(rune('a'+i%26))+`"}`))
	}
	// Near the frame limit (an SDP with many candidates).
	sent = append(sent, relay(signaling.TypeAnswer, b.ID(), "s1", `{"sdp":"`+strings.Repeat("a", maxSignalFrame-200)+`"}`))
	sent = append(sent, relay(signaling.TypeBye, b.ID(), "s1", `{"reason":"done"}`))
	for _, m := range sent {
		if err := sa.Send(ctxFor(t, 5*time.Second), m); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range sent {
		got := next(t, sb)
		if got.From != a.ID().String() || got.Type != want.Type || got.SID != "s1" || !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("message %d: got %+v; want %s %s from %s", i, got, want.Type, want.Data, a.ID())
		}
	}
	// And back, on b's own stream.
	if err := sb.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeAnswer, a.ID(), "s1", `{"sdp":"v=0"}`)); err != nil {
		t.Fatal(err)
	}
	if got := next(t, sa); got.Type != signaling.TypeAnswer || got.From != b.ID().String() {
		t.Fatalf("got %+v", got)
	}
	if st := sa.Stats(); st.Sent != int64(len(sent)) || st.Received != 1 || st.Refused != 0 {
		t.Fatalf("a stats %+v", st)
	}
}

func TestStreamSignalerSendRefuses(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa := newTestSignaler(t, a, nil)
	for name, m := range map[string]*signaling.Message{
		"not relayed": {Type: signaling.TypeJoin, To: b.ID().String(), Topic: "x"},
		"bad to":      {Type: signaling.TypeOffer, To: "nobody", SID: "s", Data: json.RawMessage(`{}`)},
		"self":        relay(signaling.TypeOffer, a.ID(), "s", `{}`),
		"no sid":      relay(signaling.TypeOffer, b.ID(), "", `{}`),
		"no data":     relay(signaling.TypeOffer, b.ID(), "s", ""),
		"too large":   relay(signaling.TypeOffer, b.ID(), "s", `"`+strings.Repeat("x", maxSignalFrame)+`"`),
	} {
		if err := sa.Send(ctxFor(t, 5*time.Second), m); err == nil {
			t.Errorf("%s: sent", name)
		}
	}
	// Not connected, no address known: refused, not hung.
	err := sa.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeOffer, b.ID(), "s", `{}`))
	if !errors.Is(err, ErrNotConnected) {
		t.Fatalf("send to an unknown peer: %v; want ErrNotConnected", err)
	}
}

// TestStreamSignalerRefusesBadFrames: a peer that writes a malformed
// frame, a message for someone else, or claims a From has its stream
// reset, and nothing reaches Incoming.
func TestStreamSignalerRefusesBadFrames(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sb := newTestSignaler(t, b, nil)
	connect(t, a, b)
	good, err := encodeSignalFrame(relay(signaling.TypeOffer, b.ID(), "s", `{"sdp":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	other, _ := encodeSignalFrame(relay(signaling.TypeOffer, a.ID(), "s", `{"sdp":"x"}`))
	body := func(s string) []byte { return append(binary.AppendUvarint(nil, uint64(len(s))), s...) }
	cases := map[string][]byte{
		"zero length":   {0},
		"too long":      binary.AppendUvarint(nil, maxSignalFrame+1),
		"non-canonical": append([]byte{0x81, 0x00}, good[1:]...),
		"not json":      body("hello"),
		"not relayed":   body(`{"type":"join","topic":"x","to":"` + b.ID().String() + `"}`),
		"has from":      body(`{"type":"offer","to":"` + b.ID().String() + `","from":"` + a.ID().String() + `","sid":"s","data":{}}`),
		"case key":      body(`{"type":"offer","To":"` + b.ID().String() + `","sid":"s","data":{}}`),
		"extra field":   body(`{"type":"offer","to":"` + b.ID().String() + `","sid":"s","data":{},"req":3}`),
		"not for b":     other,
	}
	for name, frame := range cases {
		st, err := a.NewStream(ctxFor(t, 5*time.Second), b.ID(), SignalProtocol)
		if err != nil {
			t.Fatal(err)
		}
		before := sb.Stats().Refused
		st.Write(frame)
		st.CloseWrite()
		// b resets the stream: our read ends with an error, not EOF.
		st.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, rerr := io.ReadAll(st)
		st.Close()
		if rerr == nil {
			t.Errorf("%s: stream closed cleanly; want a reset", name)
		}
		waitFor(t, 5*time.Second, name+" counted", func() bool { return sb.Stats().Refused == before+1 })
	}
	select {
	case m := <-sb.Incoming():
		t.Fatalf("delivered %+v", m)
	default:
	}
	// A good frame on a fresh stream still goes through.
	st, err := a.NewStream(ctxFor(t, 5*time.Second), b.ID(), SignalProtocol)
	if err != nil {
		t.Fatal(err)
	}
	st.Write(good)
	if m := next(t, sb); m.From != a.ID().String() || m.Type != signaling.TypeOffer {
		t.Fatalf("got %+v", m)
	}
	st.Close()
}

func TestStreamSignalerAllow(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa := newTestSignaler(t, a, nil)
	sb := newTestSignaler(t, b, func(c *SignalConfig) { c.Allow = func(peer.ID) bool { return false } })
	connect(t, a, b)
	// The write may succeed before b resets the stream; b counts it and
	// delivers nothing.
	sa.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeOffer, b.ID(), "s", `{}`))
	waitFor(t, 5*time.Second, "refusal counted", func() bool { return sb.Stats().Refused == 1 })
	select {
	case m := <-sb.Incoming():
		t.Fatalf("delivered %+v from a peer not allowed", m)
	default:
	}
}

func TestStreamSignalerRateLimit(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa := newTestSignaler(t, a, nil)
	sb := newTestSignaler(t, b, func(c *SignalConfig) { c.MessagesPerSecond, c.Burst = 0.001, 3 })
	connect(t, a, b)
	for range 4 {
		sa.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeCandidate, b.ID(), "s", `{}`))
	}
	for range 3 {
		next(t, sb)
	}
	waitFor(t, 5*time.Second, "rate refusal", func() bool { return sb.Stats().Refused == 1 })
}

// TestStreamSignalerReopens: after the idle closer closes our stream, the
// next message opens a new one.
func TestStreamSignalerReopens(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa := newTestSignaler(t, a, func(c *SignalConfig) { c.IdleTimeout = 200 * time.Millisecond })
	sb := newTestSignaler(t, b, nil)
	connect(t, a, b)
	for i := range 3 {
		if err := sa.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeCandidate, b.ID(), "s", `{}`)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		next(t, sb)
		waitFor(t, 5*time.Second, "idle stream closed", func() bool {
			sa.mu.Lock()
			defer sa.mu.Unlock()
			return len(sa.out) == 0
		})
	}
}

// TestStreamSignalerPeerClosesStream: when the peer drops our stream
// (its idle timeout), the next message goes on a new one.
func TestStreamSignalerPeerClosesStream(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa := newTestSignaler(t, a, nil)
	sb := newTestSignaler(t, b, func(c *SignalConfig) { c.IdleTimeout = 100 * time.Millisecond })
	connect(t, a, b)
	outStreamOf := func() network.Stream {
		sa.mu.Lock()
		o := sa.out[b.ID()]
		sa.mu.Unlock()
		if o == nil {
			return nil
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.s
	}
	for i := range 3 {
		if err := sa.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeCandidate, b.ID(), "s", `{}`)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		next(t, sb)
		waitFor(t, 5*time.Second, "a forgets the stream b dropped", func() bool { return outStreamOf() == nil })
	}
}

// TestStreamSignalerRetriesDeadStream: a write that fails on a stream
// used before is retried once on a new stream.
func TestStreamSignalerRetriesDeadStream(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	sa := newTestSignaler(t, a, nil)
	sb := newTestSignaler(t, b, nil)
	connect(t, a, b)
	// A stream that died without a watcher noticing.
	dead, err := a.NewStream(ctxFor(t, 5*time.Second), b.ID(), SignalProtocol)
	if err != nil {
		t.Fatal(err)
	}
	dead.Reset()
	o, err := sa.outTo(b.ID())
	if err != nil {
		t.Fatal(err)
	}
	o.mu.Lock()
	o.s = dead
	o.mu.Unlock()
	if err := sa.Send(ctxFor(t, 5*time.Second), relay(signaling.TypeOffer, b.ID(), "s", `{"sdp":"x"}`)); err != nil {
		t.Fatal(err)
	}
	if m := next(t, sb); m.Type != signaling.TypeOffer {
		t.Fatalf("got %+v", m)
	}
}

func TestSignalFrameRoundTrip(t *testing.T) {
	b := newTestHost(t)
	m := relay(signaling.TypeBye, b.ID(), "sid-1", `{"reason":"x"}`)
	f, err := encodeSignalFrame(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readSignalFrame(bufio.NewReader(bytes.NewReader(f)))
	if err != nil {
		t.Fatal(err)
	}
	if got.Type != m.Type || got.To != m.To || got.SID != m.SID || string(got.Data) != string(m.Data) {
		t.Fatalf("got %+v", got)
	}
	if _, err := readSignalFrame(bufio.NewReader(bytes.NewReader(f[:len(f)-1]))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short frame: %v", err)
	}
	if _, err := readSignalFrame(bufio.NewReader(bytes.NewReader(nil))); err != io.EOF {
		t.Fatalf("no frame: %v; want EOF", err)
	}
}

// FuzzSignalFrame: no input panics the frame reader, and whatever it
// accepts is a relayed message for someone, without From, that encodes
// to a frame it accepts again.
func FuzzSignalFrame(f *testing.F) {
	to := "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
	for _, s := range []string{
		`{"type":"offer","to":"` + to + `","sid":"s","data":{"sdp":"v=0"}}`,
		`{"type":"bye","to":"` + to + `","sid":"s"}`,
		`{"type":"candidate","to":"` + to + `","sid":"s","data":{},"from":"x"}`,
	} {
		f.Add(append(binary.AppendUvarint(nil, uint64(len(s))), s...))
	}
	f.Add([]byte{0x81, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readSignalFrame(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			return
		}
		if !signaling.IsRelay(m.Type) || m.To == "" || m.From != "" || m.SID == "" {
			t.Fatalf("accepted %+v", m)
		}
		f2, err := encodeSignalFrame(m)
		if err != nil {
			t.Fatalf("accepted message does not encode: %v", err)
		}
		if _, err := readSignalFrame(bufio.NewReader(bytes.NewReader(f2))); err != nil {
			t.Fatalf("re-encoded frame refused: %v", err)
		}
	})
}

// testNode is a swarm node with its own store, whose libp2p host shares
// its identity.
type testNode struct {
	*swarm.Node
	h  *Host
	st *cas.Store
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostConfig{Identity: id, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	n, err := swarm.NewNode(swarm.Config{Identity: id, Source: st, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return &testNode{Node: n, h: h, st: st}
}

func fetchAndCheck(t *testing.T, from, to *testNode, data []byte) {
	t.Helper()
	inf, err := from.st.Put(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	got, err := to.Fetch(ctxFor(t, 60*time.Second), to.st, inf.CID, swarm.FetchOptions{Peers: []peer.ID{from.ID()}})
	if err != nil {
		t.Fatal(err)
	}
	if got.CID != inf.CID || got.Size != int64(len(data)) {
		t.Fatalf("fetched %+v; want %s", got, inf.CID)
	}
	fr, err := to.st.OpenFile(inf.CID)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, fr.Size())
	if _, err := fr.ReadAt(b, 0); err != nil && len(b) > 0 {
		t.Fatal(err)
	}
	if !bytes.Equal(b, data) {
		t.Fatal("fetched bytes differ")
	}
}

func testData(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// TestNodesFetchOverLibp2pSignaling: two swarm nodes whose hosts are
// connected exchange their WebRTC offer, answer and candidates over
// /rdrr/signal/1 only (no signaling server exists) and fetch a blob.
func TestNodesFetchOverLibp2pSignaling(t *testing.T) {
	a, b := newTestNode(t), newTestNode(t)
	sa, sb := newTestSignaler(t, a.h, nil), newTestSignaler(t, b.h, nil)
	if err := a.Start(sa); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(sb); err != nil {
		t.Fatal(err)
	}
	connect(t, b.h, a.h)
	fetchAndCheck(t, a, b, testData(3<<20+12345, 1))
	if a.Links(b.ID()) == 0 {
		t.Fatal("a has no link to b")
	}
	if st := sb.Stats(); st.Sent == 0 || st.Received == 0 {
		t.Fatalf("b's signaler stats %+v: nothing went over libp2p", st)
	}
}

// startServer runs a signaling server that the test can stop.
func startServer(t *testing.T) (url string, stop func()) {
	srv := signaling.NewServer(signaling.Config{RelayToAnyPeer: true})
	hs := httptest.NewServer(srv)
	var once bool
	stop = func() {
		if !once {
			once = true
			srv.Close()
			hs.Close()
		}
	}
	t.Cleanup(stop)
	return "ws" + strings.TrimPrefix(hs.URL, "http") + signaling.Path, stop
}

func dialServer(t *testing.T, url string, n *testNode) *signaling.Client {
	t.Helper()
	sc, err := signaling.Dial(ctxFor(t, 10*time.Second), url, signaling.ClientConfig{Key: n.h.Identity().Key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

// TestRouterOutlivesSignalingServer: nodes routed over libp2p and a
// signaling server keep connecting after the server is gone, and take
// the next server's session without a new node.
func TestRouterOutlivesSignalingServer(t *testing.T) {
	url, stop := startServer(t)
	nodes := []*testNode{newTestNode(t), newTestNode(t), newTestNode(t)}
	sigs := make([]*StreamSignaler, len(nodes))
	routers := make([]*SignalRouter, len(nodes))
	for i, n := range nodes {
		sigs[i] = newTestSignaler(t, n.h, nil)
		routers[i] = NewSignalRouter(sigs[i], dialServer(t, url, n))
		t.Cleanup(func() { routers[i].Close() })
		if err := n.Start(routers[i]); err != nil {
			t.Fatal(err)
		}
	}
	// 0 and 1 have no libp2p connection: they meet through the server.
	fetchAndCheck(t, nodes[0], nodes[1], testData(100<<10, 2))
	if st := sigs[1].Stats(); st.Sent != 0 {
		t.Fatalf("signaled over libp2p without a connection: %+v", st)
	}
	// 2 is connected to 0 over libp2p; the server goes away.
	connect(t, nodes[2].h, nodes[0].h)
	stop()
	fetchAndCheck(t, nodes[0], nodes[2], testData(200<<10, 3))
	if st := sigs[2].Stats(); st.Sent == 0 || st.Received == 0 {
		t.Fatalf("node 2 signaler stats %+v", st)
	}
	// 1 and 2 share no libp2p connection: they need a server, and the
	// routers take a new one's sessions.
	url2, _ := startServer(t)
	for _, i := range []int{1, 2} {
		if err := routers[i].SetFallback(dialServer(t, url2, nodes[i])); err != nil {
			t.Fatal(err)
		}
	}
	sent := sigs[1].Stats().Sent
	fetchAndCheck(t, nodes[2], nodes[1], testData(50<<10, 4))
	if st := sigs[1].Stats(); st.Sent != sent {
		t.Fatalf("1 signaled over libp2p without a connection: %+v", st)
	}
}
