package kernels

import (
	"bytes"
	"container/heap"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// An Endorsement is a peer's signed statement that a kernel variant is
// correct and faster than a baseline on a class of device, for a shape
// bucket of an op. ENDORSEMENT.md gives the canonical encoding, the
// signature and the threat model.
//
// The fields are in the order of their JSON names, sorted (RFC 8785), so
// that encoding/json writes the canonical form.
type Endorsement struct {
	ABI         int     `json:"abi"`         // the op's ABI version
	Baseline    cas.CID `json:"baseline"`    // the variant it was timed against
	BaselineNs  int64   `json:"baselineNs"`  // median time of one baseline dispatch
	CandidateNs int64   `json:"candidateNs"` // median time of one candidate dispatch
	Class       string  `json:"class"`       // exact device class
	Coarse      string  `json:"coarse"`      // coarse device class (the gossip topic)
	Expires     int64   `json:"expires"`     // Unix seconds
	Issued      int64   `json:"issued"`      // Unix seconds
	Kernel      cas.CID `json:"kernel"`      // the variant's descriptor blob
	Nonce       uint64  `json:"nonce"`       // never reused by a peer
	Op          string  `json:"op"`
	Peer        string  `json:"peer"`  // the endorser's peer ID
	Seed        uint64  `json:"seed"`  // of the gate's and the timing's inputs
	Shape       string  `json:"shape"` // shape bucket (Bucket)
	Speedup     float64 `json:"speedup"`
	SpeedupHigh float64 `json:"speedupHigh"` // bootstrap 95% interval
	SpeedupLow  float64 `json:"speedupLow"`
	Tool        string  `json:"tool"` // tool version
	Version     int     `json:"v"`
}

// SignedEndorsement is an endorsement with its signature: the wire and
// storage form.
type SignedEndorsement struct {
	Endorsement Endorsement `json:"endorsement"`
	Sig         []byte      `json:"sig"`
}

// Version of the endorsement format.
const Version = 1

// Limits on what Decode and Verify accept.
const (
	MaxEndorsementBytes = 2048
	MaxLifetime         = 90 * 24 * time.Hour
	MaxClockSkew        = 10 * time.Minute
	maxSafeInt          = 1<<53 - 1 // integers survive a float64 (RFC 8785 numbers)
	maxSpeedup          = 1000
)

// MinSpeedup is the rule for endorsing: a speedup of at least MinSpeedup
// whose interval's low end is above 1.
const MinSpeedup = 1.2

// domain separates endorsement signatures from every other use of a key.
const domain = "rdrr-endorsement-v1\x00"

var (
	classPart = `[a-z0-9._-]{1,48}`
	coarseRE  = regexp.MustCompile(`^` + classPart + `/` + classPart + `/` + classPart + `$`)
	driverRE  = regexp.MustCompile(`^` + classPart + `$`)
	toolRE    = regexp.MustCompile(`^[A-Za-z0-9._+/-]{1,64}$`)
)

// Canonical returns the bytes that are signed: the RFC 8785 (JCS) form of
// the endorsement, which is what encoding/json writes for it (sorted
// fields, no white space, ECMAScript number form; every string is from a
// charset that needs no escaping).
func (e *Endorsement) Canonical() []byte {
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("kernels: encode endorsement: %v", err)) // only NaN/Inf, which check refuses
	}
	return b
}

// message is what the signature covers.
func (e *Endorsement) message() []byte { return append([]byte(domain), e.Canonical()...) }

// Sign checks e and signs it with key (whose peer ID must be e.Peer).
func Sign(e Endorsement, key crypto.PrivKey) (*SignedEndorsement, error) {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if e.Peer != id.String() {
		return nil, fmt.Errorf("kernels: endorsement names peer %s; the key is %s's", e.Peer, id)
	}
	if err := e.check(); err != nil {
		return nil, err
	}
	sig, err := key.Sign(e.message())
	if err != nil {
		return nil, err
	}
	return &SignedEndorsement{Endorsement: e, Sig: sig}, nil
}

// Encode returns the signed endorsement's wire bytes (RFC 8785 of
// {"endorsement": ..., "sig": base64}).
func (s *SignedEndorsement) Encode() []byte {
	b, err := json.Marshal(s)
	if err != nil {
		panic(fmt.Sprintf("kernels: encode endorsement: %v", err))
	}
	return b
}

// Decode parses wire bytes strictly: at most MaxEndorsementBytes, no
// unknown fields, no trailing data, every field in bounds, and the
// canonical form only (so one endorsement has one encoding). It does not
// check the signature: Verify does. Errors wrap ErrSchema.
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
	if err := s.Endorsement.check(); err != nil {
		return nil, err
	}
	if len(s.Sig) != 64 {
		return nil, fmt.Errorf("%w: signature of %d bytes (Ed25519: 64)", ErrSchema, len(s.Sig))
	}
	if !bytes.Equal(s.Encode(), b) {
		return nil, fmt.Errorf("%w: not canonical", ErrSchema)
	}
	return &s, nil
}

// ID is the endorsement's identity: the SHA-256 of its canonical bytes.
func (e *Endorsement) ID() [32]byte { return sha256.Sum256(e.Canonical()) }

// check validates the fields alone (no signature, no clock).
func (e *Endorsement) check() error {
	bad := func(f string, args ...any) error { return fmt.Errorf("%w: %s", ErrSchema, fmt.Sprintf(f, args...)) }
	switch {
	case e.Version != Version:
		return bad("version %d (want %d)", e.Version, Version)
	case e.Kernel.IsZero() || e.Kernel.IsCollection() || e.Baseline.IsZero() || e.Baseline.IsCollection():
		return bad("kernel and baseline must be raw CIDs")
	case e.Kernel == e.Baseline:
		return bad("kernel %s is its own baseline", e.Kernel)
	case !validOp(e.Op):
		return bad("unknown op %q", e.Op)
	case e.ABI <= 0 || e.ABI > 1000:
		return bad("abi %d", e.ABI)
	case !coarseRE.MatchString(e.Coarse) || len(e.Class) <= len(e.Coarse)+1 || e.Class[:len(e.Coarse)+1] != e.Coarse+"/" ||
		!driverRE.MatchString(e.Class[len(e.Coarse)+1:]):
		return bad("class %q and coarse class %q (want backend/vendor/device/driver and its first three parts)", e.Class, e.Coarse)
	case !toolRE.MatchString(e.Tool):
		return bad("tool %q", e.Tool)
	case e.CandidateNs <= 0 || e.BaselineNs <= 0 || e.CandidateNs > maxSafeInt || e.BaselineNs > maxSafeInt:
		return bad("times %d, %d ns (1..2^53-1)", e.CandidateNs, e.BaselineNs)
	case e.Seed > maxSafeInt || e.Nonce > maxSafeInt:
		return bad("seed %d and nonce %d must be below 2^53", e.Seed, e.Nonce)
	case !inRange(e.Speedup, e.SpeedupLow, e.SpeedupHigh) || e.SpeedupLow > e.Speedup || e.Speedup > e.SpeedupHigh:
		return bad("speedup %g and its interval [%g, %g] (0 < low <= speedup <= high <= %d)", e.Speedup, e.SpeedupLow, e.SpeedupHigh, maxSpeedup)
	case math.Abs(float64(e.BaselineNs)/float64(e.CandidateNs)-e.Speedup) > 0.05*e.Speedup:
		return bad("speedup %g does not match the times (%d / %d ns)", e.Speedup, e.BaselineNs, e.CandidateNs)
	case e.Issued <= 0 || e.Expires <= e.Issued || e.Expires-e.Issued > int64(MaxLifetime/time.Second):
		return bad("lifetime [%d, %d] (at most %v)", e.Issued, e.Expires, MaxLifetime)
	}
	if err := checkBucket(e.Op, e.Shape); err != nil {
		return bad("%v", err)
	}
	if err := canonicalPeer(e.Peer); err != nil {
		return bad("peer: %v", err)
	}
	return nil
}

func inRange(xs ...float64) bool {
	for _, x := range xs {
		if !(x > 0 && x <= maxSpeedup) { // false for NaN
			return false
		}
	}
	return true
}

// Faster reports whether e meets the endorsing rule: a speedup of at least
// MinSpeedup whose interval's low end is above 1.
func (e *Endorsement) Faster() bool { return e.Speedup >= MinSpeedup && e.SpeedupLow > 1 }

// Verifier checks received endorsements: schema, signature, device class,
// ABI, time, the endorsing rule, and replay. Safe for concurrent use.
type Verifier struct {
	// Class is this device's class. An endorsement must name its exact
	// class, or only its coarse class when AnyDriver is set (the local
	// benchmark decides anyway).
	Class     DeviceClass
	AnyDriver bool
	// ABI maps each op to this build's ABI version (ABIVersions()).
	ABI map[string]int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxSeen bounds the replay set (0 means 1<<16). When it is full the
	// entries that expire first are dropped: a record replayed after that
	// is stored once anyway (the Registry keeps one copy per record, and
	// Policy counts a peer once).
	MaxSeen int

	mu   sync.Mutex
	seen seenSet
}

// Verify checks s. An error wraps ErrInvalid and one of the specific
// errors (ErrSchema, ErrSignature, ErrClass, ErrABI, ErrExpired,
// ErrNotYetValid, ErrNotFaster, ErrReplay).
func (v *Verifier) Verify(s *SignedEndorsement) error {
	if err := v.Check(s); err != nil {
		return err
	}
	e := &s.Endorsement
	now := v.now().Unix()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.seen.add(replayKey(e), e.Expires, now, v.MaxSeen) {
		return fmt.Errorf("%w: %s nonce %d", ErrReplay, e.Peer, e.Nonce)
	}
	return nil
}

// Check is Verify without the replay set: what a record must be whether
// or not it was seen before. A gossip validator runs it on every copy
// (the same record comes again, and rightly so, when its author
// republishes it for peers that joined later); Verify, which remembers,
// runs once a record is new.
func (v *Verifier) Check(s *SignedEndorsement) error {
	e := &s.Endorsement
	if err := e.check(); err != nil {
		return err
	}
	if err := checkSignature(e, s.Sig); err != nil {
		return err
	}
	switch {
	case e.Class == v.Class.Exact():
	case v.AnyDriver && e.Coarse == v.Class.Coarse():
	default:
		return fmt.Errorf("%w: %q; this device is %q", ErrClass, e.Class, v.Class.Exact())
	}
	if want, ok := v.ABI[e.Op]; !ok || e.ABI != want {
		return fmt.Errorf("%w: %s ABI %d (this build: %d)", ErrABI, e.Op, e.ABI, want)
	}
	return checkTimely(e, v.now())
}

// Relayable checks what every peer on the gossip topic of coarse class
// can check of a record, whatever its own driver and build: it decodes,
// its author signed it, it names that coarse class, it is valid now and
// faster. Whether this peer keeps it (its exact class, its ABI, replays)
// is Verify's call; a record that fails only those is still forwarded.
func Relayable(data []byte, coarse string, now time.Time) error {
	s, err := Decode(data)
	if err != nil {
		return err
	}
	e := &s.Endorsement
	if err := checkSignature(e, s.Sig); err != nil {
		return err
	}
	if e.Coarse != coarse {
		return fmt.Errorf("%w: %q on the topic of %q", ErrClass, e.Coarse, coarse)
	}
	return checkTimely(e, now)
}

// checkTimely checks that e is valid at now and claims a speedup.
func checkTimely(e *Endorsement, now time.Time) error {
	if now.Unix() >= e.Expires {
		return fmt.Errorf("%w: at %d", ErrExpired, e.Expires)
	}
	if e.Issued > now.Unix()+int64(MaxClockSkew/time.Second) {
		return fmt.Errorf("%w: at %d, now %d", ErrNotYetValid, e.Issued, now.Unix())
	}
	if !e.Faster() {
		return fmt.Errorf("%w: speedup %g, interval low %g", ErrNotFaster, e.Speedup, e.SpeedupLow)
	}
	return nil
}

// checkSignature checks sig over e against the key e.Peer embeds.
func checkSignature(e *Endorsement, sig []byte) error {
	id, err := peer.Decode(e.Peer)
	if err != nil {
		return fmt.Errorf("%w: peer %q: %v", ErrSignature, e.Peer, err)
	}
	pub, err := id.ExtractPublicKey()
	if err != nil || pub.Type() != crypto.Ed25519 {
		return fmt.Errorf("%w: peer ID %s carries no Ed25519 key", ErrSignature, e.Peer)
	}
	if ok, err := pub.Verify(e.message(), sig); err != nil || !ok {
		return fmt.Errorf("%w: from %s", ErrSignature, e.Peer)
	}
	return nil
}

func (v *Verifier) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

// replayKey identifies a record for replay: its peer and nonce. A peer
// never reuses a nonce, so a second record with the same pair is either
// the same record again or not one the peer meant.
func replayKey(e *Endorsement) [32]byte {
	h := sha256.New()
	h.Write([]byte(e.Peer))
	h.Write([]byte{0})
	h.Write(binary.BigEndian.AppendUint64(nil, e.Nonce))
	var k [32]byte
	h.Sum(k[:0])
	return k
}

// seenSet is a bounded set of keys, each until its expiry; when full, the
// entries that expire first leave first.
type seenSet struct {
	keys map[[32]byte]bool
	h    expiryHeap
}

// add inserts k (expiring at exp) and reports whether it was new.
func (s *seenSet) add(k [32]byte, exp, now int64, limit int) bool {
	if limit <= 0 {
		limit = 1 << 16
	}
	if s.keys == nil {
		s.keys = map[[32]byte]bool{}
	}
	for s.h.Len() > 0 && s.h[0].exp <= now {
		delete(s.keys, heap.Pop(&s.h).(seenEntry).key)
	}
	if s.keys[k] {
		return false
	}
	for s.h.Len() >= limit {
		delete(s.keys, heap.Pop(&s.h).(seenEntry).key)
	}
	s.keys[k] = true
	heap.Push(&s.h, seenEntry{exp, k})
	return true
}

type seenEntry struct {
	exp int64
	key [32]byte
}

type expiryHeap []seenEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].exp < h[j].exp }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(seenEntry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
