package signaling

import (
	"errors"
	"fmt"
)

// Sentinels. An *Error from the server unwraps to the sentinel of its code,
// so callers test errors.Is(err, ErrTopicFull) and the like.
var (
	ErrBadMessage     = errors.New("signaling: bad message")
	ErrUnknownType    = errors.New("signaling: unknown message type")
	ErrVersion        = errors.New("signaling: unsupported protocol version")
	ErrAuth           = errors.New("signaling: authentication failed")
	ErrIDInUse        = errors.New("signaling: peer id already registered")
	ErrTooLarge       = errors.New("signaling: message too large")
	ErrRateLimited    = errors.New("signaling: rate limited")
	ErrTopicFull      = errors.New("signaling: topic full")
	ErrTooManyTopics  = errors.New("signaling: too many topics")
	ErrServerFull     = errors.New("signaling: server full")
	ErrAddrFull       = errors.New("signaling: too many sessions from this address")
	ErrLoginsFull     = errors.New("signaling: too many sessions logging in")
	ErrUnknownPeer    = errors.New("signaling: unknown peer")
	ErrIdle           = errors.New("signaling: idle timeout")
	ErrSlowConsumer   = errors.New("signaling: slow consumer")
	ErrTooManyErrors  = errors.New("signaling: too many protocol errors")
	ErrShuttingDown   = errors.New("signaling: server shutting down")
	ErrClosed         = errors.New("signaling: connection closed")
	ErrIncomingFull   = errors.New("signaling: incoming queue full")
	errUnknownErrCode = errors.New("signaling: error")
)

// Error codes carried in the "code" field of an "error" message. The list
// is part of the protocol (PROTOCOL.md); a client must treat an unknown
// code as a generic failure.
const (
	CodeBadMessage    = "bad_message"
	CodeUnknownType   = "unknown_type"
	CodeVersion       = "unsupported_version"
	CodeAuthFailed    = "auth_failed"
	CodeIDInUse       = "id_in_use"
	CodeTooLarge      = "too_large"
	CodeRateLimited   = "rate_limited"
	CodeTopicFull     = "topic_full"
	CodeTooManyTopics = "too_many_topics"
	CodeServerFull    = "server_full"
	CodeAddrFull      = "addr_full"
	CodeLoginsFull    = "logins_full"
	CodeUnknownPeer   = "unknown_peer"
	CodeIdleTimeout   = "idle_timeout"
	CodeSlowConsumer  = "slow_consumer"
	CodeTooManyErrors = "too_many_errors"
	CodeShuttingDown  = "shutting_down"
)

var codeErr = map[string]error{
	CodeBadMessage:    ErrBadMessage,
	CodeUnknownType:   ErrUnknownType,
	CodeVersion:       ErrVersion,
	CodeAuthFailed:    ErrAuth,
	CodeIDInUse:       ErrIDInUse,
	CodeTooLarge:      ErrTooLarge,
	CodeRateLimited:   ErrRateLimited,
	CodeTopicFull:     ErrTopicFull,
	CodeTooManyTopics: ErrTooManyTopics,
	CodeServerFull:    ErrServerFull,
	CodeAddrFull:      ErrAddrFull,
	CodeLoginsFull:    ErrLoginsFull,
	CodeUnknownPeer:   ErrUnknownPeer,
	CodeIdleTimeout:   ErrIdle,
	CodeSlowConsumer:  ErrSlowConsumer,
	CodeTooManyErrors: ErrTooManyErrors,
	CodeShuttingDown:  ErrShuttingDown,
}

// Error is an "error" message received from the server.
type Error struct {
	Code   string // one of the Code* constants (or one this version does not know)
	Reason string // human-readable detail
	Peer   string // for unknown_peer: the peer the message was for
}

func (e *Error) Error() string {
	s := "signaling: server error " + e.Code
	if e.Peer != "" {
		s += " (peer " + e.Peer + ")"
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Unwrap returns the sentinel of e's code.
func (e *Error) Unwrap() error {
	if err, ok := codeErr[e.Code]; ok {
		return err
	}
	return errUnknownErrCode
}

// DecodeError says what is wrong with a message that failed to decode.
type DecodeError struct {
	Type   string // the message type, if it was readable
	Req    uint64 // the request id, if it was readable (echoed in the error)
	Reason string
	Err    error // ErrBadMessage, ErrUnknownType, ErrTooLarge or ErrVersion
}

func (e *DecodeError) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("signaling: %q message: %s", e.Type, e.Reason)
	}
	return "signaling: " + e.Reason
}

func (e *DecodeError) Unwrap() error { return e.Err }

// code maps a decode failure to the protocol error code sent back.
func (e *DecodeError) code() string {
	switch {
	case errors.Is(e.Err, ErrUnknownType):
		return CodeUnknownType
	case errors.Is(e.Err, ErrTooLarge):
		return CodeTooLarge
	case errors.Is(e.Err, ErrVersion):
		return CodeVersion
	}
	return CodeBadMessage
}
