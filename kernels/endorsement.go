package kernels

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// An Endorsement is a peer's signed statement that a kernel variant is
// correct and faster than the baseline on a class of device, for a shape
// bucket of an op. ENDORSEMENT.md gives the canonical encoding, the
// signature and the threat model.
type Endorsement struct {
	Version     int     `json:"v"`
	Kernel      cas.CID `json:"kernel"` // the variant's descriptor blob
	Op          string  `json:"op"`
	ABI         int     `json:"abi"`
	Class       string  `json:"class"`  // exact device class
	Coarse      string  `json:"coarse"` // coarse device class (the gossip topic)
	Shape       string  `json:"shape"`  // shape bucket
	Baseline    cas.CID `json:"baseline"`
	CandidateNs int64   `json:"candidateNs"` // median time of one dispatch
	BaselineNs  int64   `json:"baselineNs"`
	Speedup     float64 `json:"speedup"`
	SpeedupLow  float64 `json:"speedupLow"` // bootstrap 95% interval
	SpeedupHigh float64 `json:"speedupHigh"`
	Seed        uint64  `json:"seed"`    // of the gate's and the timing's inputs
	Tool        string  `json:"tool"`    // tool version
	Peer        string  `json:"peer"`    // the endorser's peer ID
	Issued      int64   `json:"issued"`  // Unix seconds
	Expires     int64   `json:"expires"` // Unix seconds
	Nonce       uint64  `json:"nonce"`
}

// SignedEndorsement is an endorsement with its signature: the wire and
// storage form.
type SignedEndorsement struct {
	Endorsement Endorsement `json:"endorsement"`
	Sig         []byte      `json:"sig"`
}

// Version of the endorsement format.
const Version = 1

// Limits on what Decode accepts.
const (
	MaxEndorsementBytes = 4096
	MaxLifetime         = 90 * 24 * time.Hour
	MaxClockSkew        = 10 * time.Minute
)

// The rule for endorsing: at least MinSpeedup, and the interval's low end
// above 1.
const MinSpeedup = 1.2

// domain separates endorsement signatures from every other use of a key.
const domain = "rdrr-endorsement-v1\x00"

// Errors of Verify, each wrapping ErrInvalid.
var (
	ErrInvalid   = errors.New("kernels: invalid endorsement")
	ErrSignature = fmt.Errorf("%w: bad signature", ErrInvalid)
	ErrExpired   = fmt.Errorf("%w: expired", ErrInvalid)
	ErrReplay    = fmt.Errorf("%w: replayed", ErrInvalid)
	ErrClass     = fmt.Errorf("%w: another device class", ErrInvalid)
	ErrABI       = fmt.Errorf("%w: another ABI", ErrInvalid)
	ErrSchema    = fmt.Errorf("%w: malformed", ErrInvalid)
	ErrNotFaster = fmt.Errorf("%w: not faster by the rule", ErrInvalid)
)

// Canonical returns the bytes that are signed: compact JSON with the
// fields in the order of the struct (encoding/json's order), no
// white space, numbers as encoding/json writes them.
func (e *Endorsement) Canonical() []byte {
	b, _ := json.Marshal(e)
	return b
}

// Sign signs e with key (whose peer ID must be e.Peer).
func Sign(e Endorsement, key crypto.PrivKey) (*SignedEndorsement, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if e.Peer != id.String() {
		return nil, fmt.Errorf("kernels: endorsement names peer %s; the key is %s's", e.Peer, id)
	}
	sig, err := key.Sign(append([]byte(domain), e.Canonical()...))
	if err != nil {
		return nil, err
	}
	return &SignedEndorsement{Endorsement: e, Sig: sig}, nil
}

// Encode returns the signed endorsement's wire bytes.
func (s *SignedEndorsement) Encode() []byte {
	b, _ := json.Marshal(s)
	return b
}

// Decode parses wire bytes strictly: at most MaxEndorsementBytes, no
// unknown fields, no trailing data, the canonical form only (so one
// endorsement has one encoding and one ID).
func Decode(b []byte) (*SignedEndorsement, error) {
	if len(b) > MaxEndorsementBytes {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrSchema, len(b), MaxEndorsementBytes)
	}
	var s SignedEndorsement
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrSchema)
	}
	if !bytes.Equal(s.Encode(), b) {
		return nil, fmt.Errorf("%w: not canonical", ErrSchema)
	}
	return &s, nil
}

// ID is the endorsement's identity for replay detection: the hash of its
// canonical bytes.
func (e *Endorsement) ID() [32]byte { return sha256.Sum256(e.Canonical()) }

// check validates the fields alone (no signature, no time).
func (e *Endorsement) check() error {
	bad := func(f string, args ...any) error { return fmt.Errorf("%w: %s", ErrSchema, fmt.Sprintf(f, args...)) }
	switch {
	case e.Version != Version:
		return bad("version %d (want %d)", e.Version, Version)
	case e.Kernel.IsCollection() || e.Baseline.IsCollection() || e.Kernel == (cas.CID{}) || e.Baseline == (cas.CID{}):
		return bad("kernel and baseline must be raw CIDs")
	case !validOp(e.Op):
		return bad("unknown op %q", e.Op)
	case e.ABI <= 0 || e.ABI > 1000:
		return bad("abi %d", e.ABI)
	case e.Class == "" || len(e.Class) > 256 || e.Coarse == "" || len(e.Coarse) > 128 || len(e.Shape) > 64 || len(e.Tool) > 64:
		return bad("class, coarse class, shape or tool out of bounds")
	case e.CandidateNs <= 0 || e.BaselineNs <= 0:
		return bad("times must be positive")
	case !finite(e.Speedup, e.SpeedupLow, e.SpeedupHigh) || e.SpeedupLow > e.Speedup || e.Speedup > e.SpeedupHigh:
		return bad("speedup %g outside its interval [%g, %g]", e.Speedup, e.SpeedupLow, e.SpeedupHigh)
	case math.Abs(float64(e.BaselineNs)/float64(e.CandidateNs)-e.Speedup) > 0.05*e.Speedup:
		return bad("speedup %g does not match the times (%d / %d ns)", e.Speedup, e.BaselineNs, e.CandidateNs)
	case e.Expires <= e.Issued || time.Duration(e.Expires-e.Issued)*time.Second > MaxLifetime:
		return bad("lifetime [%d, %d] (at most %v)", e.Issued, e.Expires, MaxLifetime)
	}
	if _, err := peer.Decode(e.Peer); err != nil {
		return bad("peer: %v", err)
	}
	return nil
}

func finite(xs ...float64) bool {
	for _, x := range xs {
		if math.IsNaN(x) || math.IsInf(x, 0) || x <= 0 {
			return false
		}
	}
	return true
}

// Faster reports whether e meets the endorsing rule: a speedup of at least
// MinSpeedup whose interval's low end is above 1.
func (e *Endorsement) Faster() bool { return e.Speedup >= MinSpeedup && e.SpeedupLow > 1 }

// Verifier checks received endorsements: schema, signature, class, ABI,
// time and replay. Not safe for concurrent use.
type Verifier struct {
	Class string         // this device's exact class
	ABI   map[string]int // op -> this build's ABI version
	Now   func() time.Time
	seen  map[[32]byte]int64 // endorsement ID -> expiry
}

// maxSeen bounds the replay set; expired entries are dropped first.
const maxSeen = 1 << 16

// Verify checks s. An error wraps ErrInvalid and one of the specific
// errors above.
func (v *Verifier) Verify(s *SignedEndorsement) error {
	e := &s.Endorsement
	if err := e.check(); err != nil {
		return err
	}
	id, _ := peer.Decode(e.Peer)
	pub, err := id.ExtractPublicKey()
	if err != nil || pub.Type() != crypto.Ed25519 {
		return fmt.Errorf("%w: peer ID carries no Ed25519 key", ErrSignature)
	}
	if ok, err := pub.Verify(append([]byte(domain), e.Canonical()...), s.Sig); err != nil || !ok {
		return ErrSignature
	}
	if e.Class != v.Class {
		return fmt.Errorf("%w: %q, this device is %q", ErrClass, e.Class, v.Class)
	}
	if want, ok := v.ABI[e.Op]; !ok || e.ABI != want {
		return fmt.Errorf("%w: %s ABI %d (this build: %d)", ErrABI, e.Op, e.ABI, want)
	}
	t := v.now().Unix()
	if t >= e.Expires {
		return ErrExpired
	}
	if e.Issued > t+int64(MaxClockSkew/time.Second) {
		return fmt.Errorf("%w: issued in the future", ErrSchema)
	}
	if !e.Faster() {
		return ErrNotFaster
	}
	if v.seen == nil {
		v.seen = map[[32]byte]int64{}
	}
	key := e.ID()
	if _, dup := v.seen[key]; dup {
		return ErrReplay
	}
	if len(v.seen) >= maxSeen {
		for k, exp := range v.seen {
			if exp <= t {
				delete(v.seen, k)
			}
		}
		if len(v.seen) >= maxSeen {
			return fmt.Errorf("%w: too many endorsements in flight", ErrInvalid)
		}
	}
	v.seen[key] = e.Expires
	return nil
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func validOp(op string) bool {
	for _, o := range Ops {
		if o == op {
			return true
		}
	}
	return false
}

// Ops are the ops whose kernels can be endorsed.
var Ops = []string{"q4k_matvec", "q4k_matvec_group", "q4k_matmul", "q4k_dequant", "dense_matmul", "rmsnorm",
	"softmax", "rope", "attention_decode", "route_topk", "swiglu", "accumulate", "embed", "argmax", "topp"}
