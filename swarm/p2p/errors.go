package p2p

import "errors"

var (
	// ErrClosed is returned by calls on something already closed.
	ErrClosed = errors.New("p2p: closed")
	// ErrBadHave wraps every reason a have-announcement is refused.
	ErrBadHave = errors.New("p2p: malformed have-announcement")
	// ErrBadSignal wraps every reason a signaling frame is refused.
	ErrBadSignal = errors.New("p2p: malformed signaling frame")
	// ErrTooLarge is returned when a message is over its topic's or
	// protocol's size limit.
	ErrTooLarge = errors.New("p2p: message too large")
	// ErrNotConnected is returned when a signaling message is for a peer
	// the host has no connection to and no route to.
	ErrNotConnected = errors.New("p2p: no libp2p connection to peer")
)
