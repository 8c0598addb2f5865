package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rdrr/peer/cas"
)

func newTestGossip(t *testing.T, h *Host) *Gossip {
	t.Helper()
	g, err := NewGossip(h, GossipConfig{Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

func connect(t *testing.T, a, b *Host) {
	t.Helper()
	if err := a.Connect(ctxFor(t, 10*time.Second), b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
}

// waitTopicPeers waits until t knows n subscribed peers.
func waitTopicPeers(t *testing.T, tp *Topic, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d peers on %s", n, tp.Name()), func() bool { return len(tp.Peers()) >= n })
}

func TestHaveGossipDelivered(t *testing.T) {
	const n = 6
	hosts := make([]*Host, n)
	haves := make([]*Haves, n)
	for i := range n {
		hosts[i] = newTestHost(t)
		hv, err := newTestGossip(t, hosts[i]).JoinHaves("rdrr")
		if err != nil {
			t.Fatal(err)
		}
		haves[i] = hv
	}
	// A line: 0-1-2-3-4-5; what 0 says reaches 5 only by forwarding.
	for i := 1; i < n; i++ {
		connect(t, hosts[i-1], hosts[i])
	}
	for i := range n {
		want := 2
		if i == 0 || i == n-1 {
			want = 1
		}
		waitTopicPeers(t, haves[i].Topic, want)
	}
	cids := []cas.CID{cas.Sum([]byte("x")), cas.CollectionCID(cas.Sum([]byte("y")).Digest())}
	// The mesh forms at gossipsub's heartbeat: 0 repeats its announcement
	// until each host has one.
	got := make([]HaveAnnouncement, n)
	for i := 1; i < n; i++ {
		ctx := ctxFor(t, 20*time.Second)
		for {
			if err := haves[0].Announce(ctx, cids); err != nil {
				t.Fatal(err)
			}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			from, a, err := haves[i].NextHave(rctx)
			cancel()
			if err == nil {
				if from != hosts[0].ID() {
					t.Fatalf("host %d: announcement from %s; want %s", i, from, hosts[0].ID())
				}
				got[i] = a
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("host %d: no announcement: %v", i, err)
			}
		}
		if !slices.Equal(got[i].CIDs, cids) {
			t.Fatalf("host %d got %v; want %v", i, got[i].CIDs, cids)
		}
	}
	if c := haves[5].g.Counted(haves[5].Name(), GossipAccepted); c < 1 {
		t.Fatalf("accepted count %d", c)
	}
}

// TestMalformedGossipDropped: a peer that publishes junk on the have topic
// (signed, so gossipsub itself lets it through) is stopped by its
// neighbour's validator: counted there, never delivered, never forwarded.
func TestMalformedGossipDropped(t *testing.T) {
	rogue, a, b := newTestHost(t), newTestHost(t), newTestHost(t)
	ga, gb := newTestGossip(t, a), newTestGossip(t, b)
	ha, err := ga.JoinHaves("rdrr")
	if err != nil {
		t.Fatal(err)
	}
	hb, err := gb.JoinHaves("rdrr")
	if err != nil {
		t.Fatal(err)
	}
	// The rogue runs gossipsub without our validator.
	rctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rps, err := pubsub.NewGossipSub(rctx, rogue)
	if err != nil {
		t.Fatal(err)
	}
	name, _ := HaveTopic("rdrr")
	rt, err := rps.Join(name)
	if err != nil {
		t.Fatal(err)
	}
	rsub, err := rt.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer rsub.Cancel()
	// rogue - a - b
	connect(t, rogue, a)
	connect(t, a, b)
	waitTopicPeers(t, ha.Topic, 2)
	waitTopicPeers(t, hb.Topic, 1)
	waitFor(t, 10*time.Second, "rogue sees a", func() bool { return len(rt.ListPeers()) >= 1 })

	// First make sure rogue -> a -> b carries messages: the rogue repeats
	// a valid probe until b has one.
	probe, _ := HaveAnnouncement{CIDs: []cas.CID{cas.Sum([]byte("probe"))}}.MarshalBinary()
	after, _ := HaveAnnouncement{CIDs: []cas.CID{cas.Sum([]byte("after"))}}.MarshalBinary()
	ctx := ctxFor(t, 20*time.Second)
	for {
		if err := rt.Publish(ctx, probe); err != nil {
			t.Fatal(err)
		}
		mctx, stop := context.WithTimeout(ctx, time.Second)
		_, err := hb.Next(mctx)
		stop()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no path from the rogue to b: %v", err)
		}
	}
	junk := [][]byte{
		[]byte("not an announcement"),
		append([]byte{1, 1, 7}, make([]byte, 32)...), // kind 7
		append(append([]byte(nil), after...), 0),     // a trailing byte
		bytes.Repeat([]byte{1}, MaxHaveBytes+1),      // over the topic's limit
	}
	for _, j := range junk {
		if err := rt.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if err := rt.Publish(ctx, after); err != nil {
		t.Fatal(err)
	}
	// a and b deliver "after" and nothing malformed (probes may repeat).
	for name, h := range map[string]*Haves{"a": ha, "b": hb} {
		for {
			m, err := h.Next(ctx)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if bytes.Equal(m.Data, probe) {
				continue
			}
			if !bytes.Equal(m.Data, after) || m.From != rogue.ID() {
				t.Fatalf("%s delivered %q from %s", name, m.Data, m.From)
			}
			break
		}
	}
	// Validation runs on several workers, so the counts may trail "after".
	waitFor(t, 10*time.Second, "a counts the junk", func() bool {
		return ga.Counted(name, GossipRejected) == 3 && ga.Counted(name, GossipTooLarge) == 1
	})
	if rej, big := gb.Counted(name, GossipRejected), gb.Counted(name, GossipTooLarge); rej != 0 || big != 0 {
		t.Fatalf("b saw %d rejected, %d too large: a forwarded junk", rej, big)
	}
	if v := testutil.ToFloat64(ga.msgs.WithLabelValues(name, GossipAccepted)); v < 2 {
		t.Fatalf("a accepted %v; want >= 2", v)
	}
}

func TestJoinValidatedTopic(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	ga, gb := newTestGossip(t, a), newTestGossip(t, b)
	errOdd := errors.New("odd length")
	even := func(_ peer.ID, d []byte) error {
		if len(d)%2 != 0 {
			return errOdd
		}
		return nil
	}
	ta, err := ga.JoinValidatedTopic("/rdrr/test", 8, even)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ga.JoinValidatedTopic("/rdrr/test", 8, even); err == nil {
		t.Fatal("joined a topic twice")
	}
	if _, err := ga.JoinValidatedTopic("/rdrr/other", 1<<30, even); err == nil {
		t.Fatal("accepted a size limit over the frame limit")
	}
	tb, err := gb.JoinValidatedTopic("/rdrr/test", 8, even)
	if err != nil {
		t.Fatal(err)
	}
	connect(t, a, b)
	waitTopicPeers(t, ta, 1)
	waitTopicPeers(t, tb, 1)
	// Publishing validates locally: an invalid or oversized message is an
	// error.
	if err := ta.Publish(ctxFor(t, 5*time.Second), []byte("odd")); err == nil {
		t.Fatal("published an invalid message")
	}
	if err := ta.Publish(ctxFor(t, 5*time.Second), []byte("0123456789")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized publish: %v; want ErrTooLarge", err)
	}
	ctx := ctxFor(t, 20*time.Second)
	for {
		if err := ta.Publish(ctx, []byte("even")); err != nil {
			t.Fatal(err)
		}
		mctx, stop := context.WithTimeout(ctx, 2*time.Second)
		m, err := tb.Next(mctx)
		stop()
		if err == nil {
			if string(m.Data) != "even" || m.From != a.ID() {
				t.Fatalf("got %q from %s", m.Data, m.From)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.Next(ctxFor(t, time.Second)); err == nil {
		t.Fatal("Next on a closed topic returned a message")
	}
}
