package p2p

import (
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// Gater is a libp2p connection gater that refuses addresses and peers by
// two predicates, and counts what it refused.
type Gater struct {
	// AllowAddr reports whether a connection to or from the address may
	// be made (nil: any). It sees dialled addresses and, for inbound
	// connections, the remote address.
	AllowAddr func(ma.Multiaddr) bool
	// RefusePeer reports whether a peer is refused (nil: none), e.g. one
	// the swarm node has banned. Safe for concurrent use.
	RefusePeer func(peer.ID) bool

	refusedAddr, refusedPeer atomic.Int64
}

// LoopbackGater returns a gater that allows only loopback addresses
// (127.0.0.0/8 and ::1), in both directions.
func LoopbackGater() *Gater {
	return &Gater{AllowAddr: manet.IsIPLoopback}
}

// Refused returns how many dials and connections were refused for their
// address and for their peer.
func (g *Gater) Refused() (byAddr, byPeer int64) {
	return g.refusedAddr.Load(), g.refusedPeer.Load()
}

func (g *Gater) addrOK(a ma.Multiaddr) bool {
	if g.AllowAddr == nil || g.AllowAddr(a) {
		return true
	}
	g.refusedAddr.Add(1)
	return false
}

func (g *Gater) peerOK(p peer.ID) bool {
	if g.RefusePeer == nil || !g.RefusePeer(p) {
		return true
	}
	g.refusedPeer.Add(1)
	return false
}

// InterceptPeerDial implements connmgr.ConnectionGater.
func (g *Gater) InterceptPeerDial(p peer.ID) bool { return g.peerOK(p) }

// InterceptAddrDial implements connmgr.ConnectionGater.
func (g *Gater) InterceptAddrDial(_ peer.ID, a ma.Multiaddr) bool { return g.addrOK(a) }

// InterceptAccept implements connmgr.ConnectionGater.
func (g *Gater) InterceptAccept(c network.ConnMultiaddrs) bool {
	return g.addrOK(c.RemoteMultiaddr())
}

// InterceptSecured implements connmgr.ConnectionGater: the peer is known
// once the secure handshake is done.
func (g *Gater) InterceptSecured(_ network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	return g.peerOK(p)
}

// InterceptUpgraded implements connmgr.ConnectionGater.
func (g *Gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }
