package swarm

import (
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

var (
	// ErrNoProviders: no reachable peer has the blob.
	ErrNoProviders = errors.New("swarm: no peer has the blob")
	// ErrBanned: the peer sent bad data or broke the protocol and is refused.
	ErrBanned = errors.New("swarm: peer is banned")
	// ErrIdentity: a peer's DTLS certificate, or the signature binding it,
	// does not match the peer ID it claims.
	ErrIdentity = errors.New("swarm: peer identity does not match its connection")
	// ErrLinkClosed: the connection to the peer closed.
	ErrLinkClosed = errors.New("swarm: connection closed")
	// ErrClosed: the node was closed.
	ErrClosed = errors.New("swarm: node closed")
	// ErrLimit: a connection limit (links per peer, links in all, pending
	// setups) refused the connection.
	ErrLimit = errors.New("swarm: connection limit reached")
	// ErrNoSignaling: the node has no signaling client to reach peers.
	ErrNoSignaling = errors.New("swarm: no signaling client")
)

// RejectError is a REJECT received from a peer: for one request, or (Req 0)
// for the whole connection, which the peer then closed.
type RejectError struct {
	Peer   peer.ID
	Req    uint32
	Code   wire.Code
	Reason string
}

func (e *RejectError) Error() string {
	what := fmt.Sprintf("request %d", e.Req)
	if e.Req == 0 {
		what = "connection"
	}
	return fmt.Sprintf("swarm: peer %s rejected %s: %v: %s", e.Peer, what, e.Code, e.Reason)
}

// Is makes a connection-level REJECT match ErrLinkClosed.
func (e *RejectError) Is(target error) bool { return e.Req == 0 && target == ErrLinkClosed }

// ProtocolError is a violation of the wire protocol by a peer (or, for
// Local, by us, as the peer told us). The connection is closed with Code.
type ProtocolError struct {
	Peer   peer.ID
	Code   wire.Code
	Reason string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("swarm: peer %s: %v: %s", e.Peer, e.Code, e.Reason)
}

// Is makes a ProtocolError match ErrLinkClosed (the connection is gone).
func (e *ProtocolError) Is(target error) bool { return target == ErrLinkClosed }

// BadDataError says a peer sent a slice that failed verification. It wraps
// the store's *cas.RangeError (and so cas.ErrCorrupt), naming the CID and
// the first bad group.
type BadDataError struct {
	Peer peer.ID
	Err  *cas.RangeError
}

func (e *BadDataError) Error() string {
	return fmt.Sprintf("swarm: peer %s sent bad data: %v", e.Peer, e.Err)
}

func (e *BadDataError) Unwrap() error { return e.Err }

// IdentityError says why a peer's connection was refused or closed before
// any data moved.
type IdentityError struct {
	Peer   peer.ID
	Reason string
}

func (e *IdentityError) Error() string {
	return fmt.Sprintf("swarm: peer %s: %s", e.Peer, e.Reason)
}

func (e *IdentityError) Unwrap() error { return ErrIdentity }
