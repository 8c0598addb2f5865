// Package p2p owns a native peer's libp2p presence: a host whose peer ID
// is the peer's swarm ID (host.go), content routing on a Kademlia DHT
// under the protocol prefix /rdrr (dht.go), gossipsub topics whose
// messages are signed, size-limited and validated (gossip.go, have.go),
// and WebRTC signaling over a libp2p stream (signal.go), so that native
// peers that already share a libp2p connection need no signaling server.
//
// It does not move blob bytes: those travel only over the WebRTC data
// channels of swarm/PROTOCOL.md. It does not own the swarm node (package
// swarm) or the store (cas); it converts their types at its edge.
// PROTOCOL.md next to this file specifies what goes over libp2p.
//
// Nothing here talks to the public libp2p network by itself: there are no
// default bootstrap peers, mDNS is never started, and the DHT and gossip
// protocols are under /rdrr, so the swarm forms its own network.
package p2p
