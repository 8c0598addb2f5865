package p2p

import (
	"bytes"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
)

func TestReplicateMessageEncoding(t *testing.T) {
	d := cas.Sum([]byte("collection")).Digest()
	col := cas.CollectionCID(d)
	// The examples of PROTOCOL.md 3.2.
	b, err := ReplicateMessage{Replicator: true}.MarshalBinary()
	if err != nil || !bytes.Equal(b, []byte{1, 1, 0}) {
		t.Fatalf("empty replicator message = %x, %v; want 010100", b, err)
	}
	b, err = ReplicateMessage{Targets: []swarm.ReplicaTarget{{CID: col, Replicas: 3}}}.MarshalBinary()
	want := append([]byte{1, 0, 1, 3, 1}, d[:]...)
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("one target = %x, %v; want %x", b, err, want)
	}
	var m ReplicateMessage
	if err := m.UnmarshalBinary(b); err != nil || m.Replicator || len(m.Targets) != 1 || m.Targets[0].CID != col || m.Targets[0].Replicas != 3 {
		t.Fatalf("decoded %+v, %v", m, err)
	}
	// The largest message.
	var many []swarm.ReplicaTarget
	for i := range MaxReplicaTargets {
		many = append(many, swarm.ReplicaTarget{CID: cas.Sum([]byte{byte(i), byte(i >> 8)}), Replicas: MaxReplicas})
	}
	b, err = ReplicateMessage{Replicator: true, Targets: many}.MarshalBinary()
	if err != nil || len(b) != MaxReplicateBytes {
		t.Fatalf("largest message: %d bytes, %v; want %d", len(b), err, MaxReplicateBytes)
	}
	if err := m.UnmarshalBinary(b); err != nil || len(m.Targets) != MaxReplicaTargets {
		t.Fatalf("largest message: %d targets, %v", len(m.Targets), err)
	}
	for _, bad := range []ReplicateMessage{
		{Targets: append(many, swarm.ReplicaTarget{CID: col, Replicas: 1})},
		{Targets: []swarm.ReplicaTarget{{CID: col, Replicas: 0}}},
		{Targets: []swarm.ReplicaTarget{{CID: col, Replicas: 65}}},
		{Targets: []swarm.ReplicaTarget{{CID: col, Replicas: 2}, {CID: col.Raw(), Replicas: 2}}},
	} {
		if _, err := bad.MarshalBinary(); !errors.Is(err, ErrBadReplicate) {
			t.Errorf("MarshalBinary(%d targets) = %v; want ErrBadReplicate", len(bad.Targets), err)
		}
	}
	one := append([]byte{1, 0, 1, 3, 1}, d[:]...)
	for name, b := range map[string][]byte{
		"empty":             nil,
		"version 2":         {2, 0, 0},
		"unknown flag":      {1, 2, 0},
		"no count":          {1, 0},
		"long varint":       {1, 0, 0x80, 0},
		"count too large":   {1, 0, 0x81, 0x02},
		"missing target":    {1, 0, 1},
		"trailing byte":     append(append([]byte(nil), one...), 0),
		"replicas 0":        append([]byte{1, 0, 1, 0, 1}, d[:]...),
		"replicas 65":       append([]byte{1, 0, 1, 65, 1}, d[:]...),
		"kind 2":            append([]byte{1, 0, 1, 3, 2}, d[:]...),
		"repeated digest":   append(append([]byte{1, 0, 2, 3, 1}, d[:]...), append([]byte{3, 0}, d[:]...)...),
		"over the size cap": make([]byte, MaxReplicateBytes+1),
	} {
		if err := m.UnmarshalBinary(b); !errors.Is(err, ErrBadReplicate) {
			t.Errorf("%s: %v; want ErrBadReplicate", name, err)
		}
	}
}

// FuzzReplicateMessage: the decoder never panics, and what it accepts
// is canonical: it encodes back to the same bytes.
func FuzzReplicateMessage(f *testing.F) {
	d := cas.Sum([]byte("x")).Digest()
	f.Add([]byte{1, 1, 0})
	f.Add(append([]byte{1, 0, 1, 3, 1}, d[:]...))
	f.Add(append([]byte{1, 0, 1, 3, 0}, d[:]...))
	f.Add([]byte{1, 0, 0x80, 0x02})
	f.Fuzz(func(t *testing.T, b []byte) {
		var m ReplicateMessage
		if m.UnmarshalBinary(b) != nil {
			return
		}
		again, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted %x but cannot encode it: %v", b, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("accepted %x; it encodes as %x", b, again)
		}
		if validReplicate("", b) != nil {
			t.Fatal("the topic's validator refuses what the decoder accepts")
		}
	})
}

// A live peer asked about by many callers at once (a replicator counts
// the copies of several shards at once, each listing the same holders)
// is alive for every one of them, although libp2p lets two peers have
// only a few ping streams open at a time; a closed peer is dead for all.
func TestAliveManyCallersAtOnce(t *testing.T) {
	idA, _ := swarm.NewIdentity()
	idB, _ := swarm.NewIdentity()
	idC, _ := swarm.NewIdentity()
	var ovs []*Overlay
	for _, id := range []*swarm.Identity{idA, idB, idC} {
		ov, err := NewOverlay(ctxFor(t, 20*time.Second), OverlayConfig{Identity: id, Loopback: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ov.Close() })
		ovs = append(ovs, ov)
	}
	a, b, c := ovs[0], ovs[1], ovs[2]
	for _, o := range []*Overlay{b, c} {
		if err := a.Host.Connect(ctxFor(t, 5*time.Second), peer.AddrInfo{ID: o.Host.ID(), Addrs: o.Host.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	const callers = 16
	got := make([][]peer.ID, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = a.Alive(ctxFor(t, 10*time.Second), []peer.ID{b.Host.ID(), c.Host.ID()})
		}()
	}
	wg.Wait()
	for i, g := range got {
		if len(g) != 1 || g[0] != b.Host.ID() {
			t.Errorf("caller %d: alive %v; want [%s] (of %s, and %s closed)", i, g, b.Host.ID(), b.Host.ID(), c.Host.ID())
		}
	}
}
