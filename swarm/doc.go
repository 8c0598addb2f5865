// Package swarm owns a peer's identity, its WebRTC connections to other
// peers, the wire protocol spoken over them, and fetching and serving blobs
// of the content-addressed store. It does not own storage (cas) or the
// rendezvous server (signaling).
//
// A Node answers and makes pion/webrtc peer connections through a
// signaling client (session.go). Each connection (a link, link.go) binds
// the peer's DTLS certificate to its peer ID before any frame moves
// (binding.go), then carries one ordered control channel and several bulk
// channels speaking the frames of package wire. Serving answers REQUESTs
// with bao slices read verified from a Source; fetching (fetch.go) spreads
// 1 MiB pieces over several connections per peer, hands every slice to a
// cas.Partial that verifies each 16 KiB group before writing it, bans a
// peer whose data fails and fetches the range elsewhere. Every peer serves
// what it has verified, whole blobs and the pieces of its downloads in
// progress, announced in HAVE bitmaps (partial.go); fetches take pieces
// rarest first with an endgame (sched.go) and by priority (priority.go).
// A Replicator keeps R live copies of pinned collections across the
// swarm (replicate.go). PROTOCOL.md next to this file is the
// specification a browser implements.
//
// Throughput: one SCTP association is CPU-bound on this project's machines
// far below what several carry, and per-packet cost dominates at WebRTC's
// default 1191-byte packets; so a fetch uses several connections, bigger
// UDP socket buffers, and (between native peers on a path that carries
// them, when pion can) bigger SCTP packets (transport.go).
package swarm
