package swarm

import (
	"errors"
	"fmt"
	"time"

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
	// ErrProtocol: the peer broke the wire protocol (a *ProtocolError):
	// for a request, it sent a short or malformed answer, a PIECE stream
	// that is not the requested slice, or a flood of answers to finished
	// requests. The connection is closed; the fetcher should not ask the
	// peer again soon.
	ErrProtocol = errors.New("swarm: peer broke the protocol")
	// ErrRequestTimeout: a request got no complete answer in
	// Config.RequestTimeout (a *RequestTimeoutError says how much came).
	// The connection stays open; the request was cancelled.
	ErrRequestTimeout = errors.New("swarm: request timed out")
)

// What a request to a peer (link.request, link.want) can fail with, for a
// scheduler that keeps score of peers:
//
//   - ctx.Err(): the caller gave up;
//   - *RequestTimeoutError (ErrRequestTimeout): no complete answer in time;
//     Got < Want with Got > 0 is a slice that stopped short;
//   - *RejectError with Req != 0: the peer refused the request (Code says
//     why; busy and shutting_down are worth retrying elsewhere or later);
//   - *ProtocolError (ErrProtocol, ErrLinkClosed): the peer misbehaved and
//     the connection was closed (a short slice followed by another
//     answer, PIECEs that are not the requested slice, a HAVE that lists
//     what was not asked, ...);
//   - *BadDataError is not returned here: slices are verified by the
//     caller (cas.Partial);
//   - anything else matching ErrLinkClosed: the connection closed (the
//     peer went away, REJECT 0 from the peer, the network failed).

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

// ProtocolError is a violation of the wire protocol by a peer. The
// connection is closed with Code (the peer is told, REJECT 0).
type ProtocolError struct {
	Peer   peer.ID
	Code   wire.Code
	Reason string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("swarm: peer %s: %v: %s", e.Peer, e.Code, e.Reason)
}

// Is makes a ProtocolError match ErrProtocol and ErrLinkClosed (the
// connection is gone).
func (e *ProtocolError) Is(target error) bool {
	return target == ErrLinkClosed || target == ErrProtocol
}

// RequestTimeoutError is a request that got no complete answer in time:
// Got of Want bytes of the slice (0 and 0 for a WANT) arrived.
type RequestTimeoutError struct {
	Peer      peer.ID
	Req       uint32
	Got, Want int
	After     time.Duration
}

func (e *RequestTimeoutError) Error() string {
	return fmt.Sprintf("swarm: request %d to %s: %d of %d bytes in %v", e.Req, e.Peer, e.Got, e.Want, e.After)
}

func (e *RequestTimeoutError) Unwrap() error { return ErrRequestTimeout }

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
