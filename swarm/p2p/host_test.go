package p2p

import (
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/rdrr/peer/swarm"
)

// newTestHost starts a loopback host with a fresh identity.
func newTestHost(t testing.TB) *Host {
	t.Helper()
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostConfig{Identity: id, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestHostIDIsSwarmID(t *testing.T) {
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	h, err := NewHost(HostConfig{Identity: id, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.ID() != id.ID {
		t.Fatalf("host ID %s; want the swarm ID %s", h.ID(), id.ID)
	}
	var tcp, quic bool
	for _, a := range h.Addrs() {
		if !manet.IsIPLoopback(a) {
			t.Fatalf("listening on %s: not loopback", a)
		}
		if _, err := a.ValueForProtocol(ma.P_TCP); err == nil {
			tcp = true
		}
		if _, err := a.ValueForProtocol(ma.P_QUIC_V1); err == nil {
			quic = true
		}
	}
	if !tcp || !quic {
		t.Fatalf("addrs %v: want TCP and QUIC", h.Addrs())
	}
}

func TestHostConnectsOverTCPAndQUIC(t *testing.T) {
	for _, proto := range []int{ma.P_TCP, ma.P_QUIC_V1} {
		a, b := newTestHost(t), newTestHost(t)
		var addrs []ma.Multiaddr
		for _, x := range b.Addrs() {
			if _, err := x.ValueForProtocol(proto); err == nil {
				addrs = append(addrs, x)
			}
		}
		if err := a.Connect(ctxFor(t, 10*time.Second), peer.AddrInfo{ID: b.ID(), Addrs: addrs}); err != nil {
			t.Fatalf("connect over %s: %v", ma.ProtocolWithCode(proto).Name, err)
		}
		conns := a.Network().ConnsToPeer(b.ID())
		if len(conns) == 0 {
			t.Fatalf("no connection over %s", ma.ProtocolWithCode(proto).Name)
		}
		if conns[0].RemotePeer() != b.ID() {
			t.Fatalf("connected to %s; want %s", conns[0].RemotePeer(), b.ID())
		}
	}
}

// TestGaterRefusesNonLoopback: a loopback host does not dial an address
// off the machine (TEST-NET-1, which nothing answers anyway).
func TestGaterRefusesNonLoopback(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	far := []ma.Multiaddr{
		ma.StringCast("/ip4/192.0.2.1/tcp/4001"),
		ma.StringCast("/ip4/192.0.2.1/udp/4001/quic-v1"),
	}
	err := a.Connect(ctxFor(t, 10*time.Second), peer.AddrInfo{ID: b.ID(), Addrs: far})
	if err == nil {
		t.Fatal("connected to a non-loopback address")
	}
	g := a.cfg.Gater.(*Gater)
	if byAddr, _ := g.Refused(); byAddr < 1 {
		t.Fatalf("gater refused %d addresses (err %v); want >= 1", byAddr, err)
	}
	// The same host still connects over loopback.
	if err := a.Connect(ctxFor(t, 10*time.Second), b.AddrInfo()); err != nil {
		t.Fatal(err)
	}
}

func TestGaterRefusesPeer(t *testing.T) {
	id, _ := swarm.NewIdentity()
	b := newTestHost(t)
	g := LoopbackGater()
	g.RefusePeer = func(p peer.ID) bool { return p == b.ID() }
	a, err := NewHost(HostConfig{Identity: id, Loopback: true, Gater: g})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	err = a.Connect(ctxFor(t, 10*time.Second), b.AddrInfo())
	if err == nil {
		t.Fatal("connected to a refused peer")
	}
	if _, byPeer := g.Refused(); byPeer < 1 {
		t.Fatalf("refused %d peers; want >= 1", byPeer)
	}
	// Inbound: b dials a, a refuses it after the handshake.
	err = b.Connect(ctxFor(t, 10*time.Second), a.AddrInfo())
	if err == nil {
		// The dialer may see its side succeed before a closes it.
		deadline := time.Now().Add(5 * time.Second)
		for len(a.Network().ConnsToPeer(b.ID())) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if n := len(a.Network().ConnsToPeer(b.ID())); n != 0 {
		t.Fatalf("a holds %d connections from a refused peer", n)
	}
}

func TestHostConfigRequiresIdentity(t *testing.T) {
	if _, err := NewHost(HostConfig{Loopback: true}); err == nil {
		t.Fatal("no error without an identity")
	}
}
