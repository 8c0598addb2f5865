package signaling

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Version is the signaling protocol version this package speaks. It is sent
// in "challenge" and must be echoed in "auth"; the WebSocket path is /v1.
const Version = 1

// Path is the HTTP path a Server expects (any path is accepted; clients use
// this one so a future version can live next to it).
const Path = "/v1"

// Message types. PROTOCOL.md gives each one's fields and direction.
const (
	TypeChallenge = "challenge" // server -> client, first message
	TypeAuth      = "auth"      // client -> server, answers challenge
	TypeWelcome   = "welcome"   // server -> client, auth accepted
	TypeJoin      = "join"      // client -> server
	TypeLeave     = "leave"     // client -> server
	TypePeers     = "peers"     // both: request (client) and answer (server)
	TypeJoined    = "joined"    // server -> client event: a peer joined a topic
	TypeLeft      = "left"      // server -> client event: a peer left a topic
	TypeOffer     = "offer"     // relayed
	TypeAnswer    = "answer"    // relayed
	TypeCandidate = "candidate" // relayed (trickle ICE)
	TypeBye       = "bye"       // relayed: abandon a session
	TypePing      = "ping"      // client -> server
	TypePong      = "pong"      // server -> client
	TypeOK        = "ok"        // server -> client, answers leave
	TypeError     = "error"     // server -> client
)

// Field bounds, part of the protocol.
const (
	NonceSize     = 32
	MaxTopicLen   = 256
	MaxSIDLen     = 64
	MaxReasonLen  = 512
	maxIDLen      = 128
	maxSigLen     = 512
	maxPubKeyLen  = 1024
	maxPeersList  = 65536
	maxSafeReq    = 1<<53 - 1 // JSON numbers stay exact in JavaScript
	authSigDomain = "rdrr-signal/1 auth\n"
)

// Limits are the server's limits, announced in "challenge" so that clients
// can pace themselves.
type Limits struct {
	MaxMessageBytes   int     `json:"max_message_bytes"`
	MessagesPerSecond float64 `json:"messages_per_second"`
	Burst             int     `json:"burst"`
	MaxPeersPerTopic  int     `json:"max_peers_per_topic"`
	MaxTopics         int     `json:"max_topics"`
	IdleTimeoutMS     int64   `json:"idle_timeout_ms"`
	// Added after the first release of version 1; a server that does not
	// send them leaves them zero.
	AuthTimeoutMS       int64   `json:"auth_timeout_ms"`
	TopicJoinsPerSecond float64 `json:"topic_joins_per_second"`
	TopicJoinBurst      int     `json:"topic_join_burst"`
	SendQueueBytes      int64   `json:"send_queue_bytes"`
}

// Message is every signaling message; Type says which fields are set.
// Binary fields travel as standard base64 (encoding/json's []byte).
type Message struct {
	Type   string          `json:"type"`
	V      int             `json:"v,omitempty"`     // challenge, auth
	Req    uint64          `json:"req,omitempty"`   // request id, echoed in the answer or error
	Nonce  []byte          `json:"nonce,omitempty"` // challenge
	ID     string          `json:"id,omitempty"`    // auth: claimed peer id; welcome: accepted id
	PubKey []byte          `json:"pub,omitempty"`   // auth: libp2p-marshalled public key, if ID does not embed it
	Sig    []byte          `json:"sig,omitempty"`   // auth: signature of AuthPayload(nonce)
	Topic  string          `json:"topic,omitempty"` // join, leave, peers, joined, left
	Peers  []string        `json:"peers,omitempty"` // peers (answer)
	Peer   string          `json:"peer,omitempty"`  // joined, left; error unknown_peer
	From   string          `json:"from,omitempty"`  // relayed, set by the server
	To     string          `json:"to,omitempty"`    // relayed, set by the sender
	SID    string          `json:"sid,omitempty"`   // relayed: session id chosen by the offerer
	Data   json.RawMessage `json:"data,omitempty"`  // relayed payload, opaque to the server
	Code   string          `json:"code,omitempty"`  // error
	Reason string          `json:"reason,omitempty"`
	Limits *Limits         `json:"limits,omitempty"` // challenge
}

// IsRelay reports whether t is relayed from one peer to another.
func IsRelay(t string) bool {
	switch t {
	case TypeOffer, TypeAnswer, TypeCandidate, TypeBye:
		return true
	}
	return false
}

// AuthPayload is what a client signs to prove its ID: a fixed domain string
// followed by the raw nonce bytes.
func AuthPayload(nonce []byte) []byte {
	return append([]byte(authSigDomain), nonce...)
}

// Encode returns m as JSON. It does not escape <, > and & as
// json.Marshal does: Data is relayed as it came (compacted), and escaping
// would change its bytes, so that a message would not survive Encode and
// DecodeMessage unchanged (FuzzDecodeMessage found {"":"<"}).
func (m *Message) Encode() ([]byte, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// DecodeMessage parses and validates one message. It checks the fields that
// m.Type requires and every bound above; it does not check signatures or
// state (that is the server's job).
//
// The result is canonical, so that Encode and DecodeMessage round-trip: Data
// is compacted (and nil for JSON null), and an empty binary field or peer
// list is nil, as if absent (Encode omits both alike).
//
// Keys are matched exactly. encoding/json alone would match them without
// regard to case and let a repeated key win over the first, so that
// {"type":"ping","tYpe":"auth"} would mean different things to different
// decoders; DecodeMessage refuses a key that differs from a known one only
// in case, and a key given twice (PROTOCOL.md, "Transport").
func DecodeMessage(b []byte) (*Message, error) {
	var m Message
	if !utf8.Valid(b) {
		return nil, &DecodeError{Reason: "not UTF-8", Err: ErrBadMessage}
	}
	if err := checkKeys(b); err != nil {
		return nil, &DecodeError{Reason: trim(err.Error()), Err: ErrBadMessage}
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, &DecodeError{Reason: "not a JSON message: " + trim(err.Error()), Err: ErrBadMessage}
	}
	for _, f := range []*[]byte{&m.Nonce, &m.PubKey, &m.Sig} {
		if len(*f) == 0 {
			*f = nil
		}
	}
	if len(m.Peers) == 0 {
		m.Peers = nil
	}
	if len(m.Data) > 0 {
		var c bytes.Buffer
		if err := json.Compact(&c, m.Data); err != nil {
			return nil, &DecodeError{Type: m.Type, Reason: "data: " + trim(err.Error()), Err: ErrBadMessage}
		}
		m.Data = c.Bytes()
		if string(m.Data) == "null" {
			m.Data = nil
		}
	}
	if err := m.validate(); err != nil {
		if de, ok := err.(*DecodeError); ok && m.Req <= maxSafeReq {
			de.Req = m.Req
		}
		return nil, err
	}
	return &m, nil
}

func (m *Message) validate() error {
	bad := func(format string, args ...any) error {
		return &DecodeError{Type: m.Type, Reason: fmt.Sprintf(format, args...), Err: ErrBadMessage}
	}
	if m.Req > maxSafeReq {
		return bad("req %d exceeds 2^53-1", m.Req)
	}
	if len(m.Reason) > MaxReasonLen {
		return bad("reason longer than %d bytes", MaxReasonLen)
	}
	if len(m.Peers) > maxPeersList {
		return bad("more than %d peers", maxPeersList)
	}
	for _, f := range []struct{ name, v string }{{"id", m.ID}, {"peer", m.Peer}, {"from", m.From}, {"to", m.To}} {
		if f.v != "" {
			if err := checkID(f.v); err != nil {
				return bad("%s: %v", f.name, err)
			}
		}
	}
	for i, p := range m.Peers {
		if err := checkID(p); err != nil {
			return bad("peers[%d]: %v", i, err)
		}
	}
	if m.Topic != "" {
		if err := CheckTopic(m.Topic); err != nil {
			return bad("%v", err)
		}
	}
	if m.SID != "" {
		if err := checkSID(m.SID); err != nil {
			return bad("%v", err)
		}
	}
	switch m.Type {
	case TypeChallenge:
		if m.V == 0 {
			return bad("missing v")
		}
		if len(m.Nonce) != NonceSize {
			return bad("nonce is %d bytes; want %d", len(m.Nonce), NonceSize)
		}
	case TypeAuth:
		if m.V == 0 {
			return bad("missing v")
		}
		if m.V != Version {
			return &DecodeError{Type: m.Type, Reason: fmt.Sprintf("version %d; this server speaks %d", m.V, Version), Err: ErrVersion}
		}
		if m.ID == "" {
			return bad("missing id")
		}
		if len(m.Sig) == 0 || len(m.Sig) > maxSigLen {
			return bad("sig is %d bytes; want 1..%d", len(m.Sig), maxSigLen)
		}
		if len(m.PubKey) > maxPubKeyLen {
			return bad("pub longer than %d bytes", maxPubKeyLen)
		}
	case TypeWelcome:
		if m.ID == "" {
			return bad("missing id")
		}
	case TypeJoin, TypeLeave, TypeJoined, TypeLeft:
		if m.Topic == "" {
			return bad("missing topic")
		}
		if (m.Type == TypeJoined || m.Type == TypeLeft) && m.Peer == "" {
			return bad("missing peer")
		}
	case TypePeers:
		if m.Topic == "" {
			return bad("missing topic")
		}
	case TypeOffer, TypeAnswer, TypeCandidate, TypeBye:
		if m.To == "" && m.From == "" {
			return bad("missing to")
		}
		if m.SID == "" {
			return bad("missing sid")
		}
		if m.Type != TypeBye && len(m.Data) == 0 {
			return bad("missing data")
		}
	case TypePing, TypePong, TypeOK:
	case TypeError:
		if m.Code == "" {
			return bad("missing code")
		}
	case "":
		return bad("missing type")
	default:
		return &DecodeError{Type: trim(m.Type), Reason: "unknown type", Err: ErrUnknownType}
	}
	return nil
}

func checkID(s string) error {
	if len(s) > maxIDLen {
		return fmt.Errorf("peer id longer than %d bytes", maxIDLen)
	}
	if _, err := peer.Decode(s); err != nil {
		return fmt.Errorf("not a peer id")
	}
	return nil
}

// CheckTopic reports whether t is a valid topic name: 1..256 bytes of UTF-8
// without control characters.
func CheckTopic(t string) error {
	if t == "" || len(t) > MaxTopicLen {
		return fmt.Errorf("topic must be 1..%d bytes", MaxTopicLen)
	}
	for _, r := range t {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return fmt.Errorf("topic contains a control or invalid character")
		}
	}
	return nil
}

func checkSID(s string) error {
	if len(s) > MaxSIDLen {
		return fmt.Errorf("sid must be 1..%d bytes", MaxSIDLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("sid must be printable ASCII")
		}
	}
	return nil
}

// trim bounds strings copied from untrusted input into error messages.
func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
