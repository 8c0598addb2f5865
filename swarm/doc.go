// Package swarm owns a peer's identity, its WebRTC connections to other
// peers, the wire protocol spoken over them, and fetching and serving blobs
// of the content-addressed store. It does not own storage (cas) or the
// rendezvous server (signaling).
package swarm
