// Package signaling owns the rendezvous of peers: a WebSocket server that
// authenticates peer IDs, keeps topic memberships and relays WebRTC
// offers, answers and ICE candidates between peers, and the matching
// client. It does not own WebRTC itself, peer identities on disk, or what
// peers say to each other once connected (package swarm).
//
// The protocol is JSON over WebSocket, specified in PROTOCOL.md next to this
// file so that a browser can speak it. A client proves its peer ID by signing
// the server's nonce with its identity key; the server relays nothing for an
// unproven ID and refuses a second registration of a live ID. Every limit
// (message size, rate, peers per topic, idle time, connections) answers with
// an error code before it closes, and is counted (Server.Stats, and
// Server as a prometheus.Collector).
//
// Offers, answers and candidates are relayed only between peers that share
// a topic; only Ed25519 identities log in; message keys are matched
// exactly, and a repeated key is refused, so that every decoder reads a
// message the same way.
//
// The server never blocks on a client: each client has its own reader, its
// own writer and an outbound queue bounded in messages and bytes, and all
// queues together are bounded in bytes; a client that does not read is
// disconnected as a slow consumer instead of stalling the others. One
// address, the sessions still logging in, and topic joins (each of which
// notifies every member) have their own limits, so that no one client can
// take every slot or flood a topic with events.
package signaling
