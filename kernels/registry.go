package kernels

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/internal/atomicfile"
)

// Registry is the peer's record of kernels, in a directory of its home:
//
//   - active.json: the active variant of each op and the one before it
//     (for Rollback), rewritten atomically on every change, so a crash
//     leaves the old or the new choice;
//   - endorsements.json: the verified endorsements received, as their
//     wire records, bounded (MaxStoredEndorsements, MaxEndorsementsPerPeer;
//     expired ones are dropped). It is a cache: it is written at most once
//     per FlushInterval (and by Flush and Close), so a crash can lose the
//     last moments' records, which gossip brings again.
//
// Both files are checked when opened: a bad active.json is an error
// (ErrRegistry: the choice of kernels is the user's); bad or expired
// endorsement records are dropped and counted (Dropped). Safe for
// concurrent use.
type Registry struct {
	dir string
	now func() time.Time

	mu        sync.Mutex
	st        activeState
	recs      []*SignedEndorsement            // oldest first
	ids       map[[32]byte]*SignedEndorsement // Endorsement.ID -> record
	dirty     bool
	lastFlush time.Time
	dropped   int
}

type activeState struct {
	Active   map[string]string `json:"active"`   // op -> descriptor CID or "builtin"
	Previous map[string]string `json:"previous"` // op -> what was active before
}

// Builtin names the built-in kernel of an op.
const Builtin = "builtin"

// Bounds of the registry.
const (
	MaxStoredEndorsements  = 4096
	MaxEndorsementsPerPeer = 64
	FlushInterval          = time.Second
	activeFile             = "active.json"
	endorsementsFile       = "endorsements.json"
	maxActiveBytes         = 64 << 10
)

// ErrRegistry is wrapped by errors about a registry file that is not what
// this package writes.
var ErrRegistry = errors.New("kernels: bad registry file")

// OpenRegistry opens the registry in dir (creating dir), or starts an
// empty one there. now is the clock (nil: time.Now).
func OpenRegistry(dir string, now func() time.Time) (*Registry, error) {
	if now == nil {
		now = time.Now
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r := &Registry{dir: dir, now: now, ids: map[[32]byte]*SignedEndorsement{},
		st: activeState{Active: map[string]string{}, Previous: map[string]string{}}}
	if err := r.loadActive(); err != nil {
		return nil, err
	}
	if err := r.loadEndorsements(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Registry) loadActive() error {
	path := filepath.Join(r.dir, activeFile)
	b, err := readBounded(path, maxActiveBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st activeState
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrRegistry, path, err)
	}
	for _, m := range []map[string]string{st.Active, st.Previous} {
		for op, v := range m {
			if err := checkVariant(op, v); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrRegistry, path, err)
			}
		}
	}
	if st.Active != nil {
		r.st.Active = st.Active
	}
	if st.Previous != nil {
		r.st.Previous = st.Previous
	}
	return nil
}

func (r *Registry) loadEndorsements() error {
	path := filepath.Join(r.dir, endorsementsFile)
	b, err := readBounded(path, (MaxStoredEndorsements+1)*(MaxEndorsementBytes+2))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var raws []json.RawMessage
	if err := json.Unmarshal(b, &raws); err != nil {
		// A cache: start empty rather than refuse to start.
		r.dropped++
		return nil
	}
	now := r.now()
	for _, raw := range raws {
		s, err := Decode(raw)
		if err == nil {
			err = verifySignature(s)
		}
		if err != nil || now.Unix() >= s.Endorsement.Expires {
			r.dropped++
			continue
		}
		r.insert(s)
	}
	return nil
}

// readBounded reads path if it holds at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%w: %s holds %d bytes (limit %d)", ErrRegistry, path, fi.Size(), limit)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && fi.Size() > 0 {
		return nil, err
	}
	return b, nil
}

// checkVariant checks that v can be op's active variant: Builtin, or the
// canonical raw CID of a descriptor.
func checkVariant(op, v string) error {
	if !validOp(op) {
		return fmt.Errorf("%w: %q", ErrUnknownOp, op)
	}
	if v == Builtin {
		return nil
	}
	c, err := cas.ParseCID(v)
	if err != nil || c.IsCollection() || c.String() != v {
		return fmt.Errorf("kernels: variant %q of %s is neither %q nor a raw CID", v, op, Builtin)
	}
	return nil
}

func (r *Registry) saveActive() error {
	b, err := json.MarshalIndent(&r.st, "", " ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(r.dir, activeFile), append(b, '\n'), 0o644)
}

// flushLocked writes endorsements.json if it changed.
func (r *Registry) flushLocked() error {
	if !r.dirty {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("[")
	for i, s := range r.recs {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("\n")
		b.Write(s.Encode())
	}
	b.WriteString("\n]\n")
	if err := atomicfile.Write(filepath.Join(r.dir, endorsementsFile), b.Bytes(), 0o644); err != nil {
		return err
	}
	r.dirty, r.lastFlush = false, r.now()
	return nil
}

// Active returns the active variant of op (Builtin if none was chosen).
func (r *Registry) Active(op string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.st.Active[op]; ok {
		return a
	}
	return Builtin
}

// Previous returns what Rollback(op) would make active ("" if nothing).
func (r *Registry) Previous(op string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.st.Previous[op]
}

// Use makes variant (a descriptor CID, or Builtin) the active one of op,
// keeping the one before for Rollback. The caller has run the gate on
// this device: Use trusts its caller, not the variant.
func (r *Registry) Use(op, variant string) error {
	if err := checkVariant(op, variant); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := Builtin
	if a, ok := r.st.Active[op]; ok {
		prev = a
	}
	if prev == variant {
		return nil
	}
	old := r.st
	r.st = activeState{Active: copyMap(old.Active), Previous: copyMap(old.Previous)}
	r.st.Previous[op], r.st.Active[op] = prev, variant
	if err := r.saveActive(); err != nil {
		r.st = old
		return err
	}
	return nil
}

// Rollback makes the previous variant of op active again (and the current
// one the previous) and returns it.
func (r *Registry) Rollback(op string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, ok := r.st.Previous[op]
	if !ok {
		return "", fmt.Errorf("kernels: %s has no previous kernel", op)
	}
	cur := Builtin
	if a, ok := r.st.Active[op]; ok {
		cur = a
	}
	old := r.st
	r.st = activeState{Active: copyMap(old.Active), Previous: copyMap(old.Previous)}
	r.st.Active[op], r.st.Previous[op] = prev, cur
	if err := r.saveActive(); err != nil {
		r.st = old
		return "", err
	}
	return prev, nil
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// AddEndorsement stores a verified endorsement and reports whether it was
// new. Expired records go first, then a peer's oldest beyond
// MaxEndorsementsPerPeer, then the oldest beyond MaxStoredEndorsements.
func (r *Registry) AddEndorsement(s *SignedEndorsement) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids[s.Endorsement.ID()] != nil {
		return false, nil
	}
	now := r.now()
	r.prune(now)
	r.insert(s)
	r.dirty = true
	if now.Sub(r.lastFlush) >= FlushInterval {
		return true, r.flushLocked()
	}
	return true, nil
}

// insert appends s, keeping the per-peer and total bounds.
func (r *Registry) insert(s *SignedEndorsement) {
	id := s.Endorsement.ID()
	if r.ids[id] != nil {
		return
	}
	n := 0
	for _, x := range r.recs {
		if x.Endorsement.Peer == s.Endorsement.Peer {
			n++
		}
	}
	if n >= MaxEndorsementsPerPeer {
		for i, x := range r.recs {
			if x.Endorsement.Peer == s.Endorsement.Peer {
				r.remove(i)
				break
			}
		}
	}
	for len(r.recs) >= MaxStoredEndorsements {
		r.remove(0)
	}
	r.recs = append(r.recs, s)
	r.ids[id] = s
}

func (r *Registry) remove(i int) {
	delete(r.ids, r.recs[i].Endorsement.ID())
	r.recs = append(r.recs[:i], r.recs[i+1:]...)
}

func (r *Registry) prune(now time.Time) {
	keep := r.recs[:0]
	for _, s := range r.recs {
		if now.Unix() < s.Endorsement.Expires {
			keep = append(keep, s)
		} else {
			delete(r.ids, s.Endorsement.ID())
			r.dirty = true
		}
	}
	clear(r.recs[len(keep):])
	r.recs = keep
}

// Has reports whether the registry holds s itself: the same endorsement
// with the same signature (Ed25519 signatures are deterministic, so an
// author's republished record is byte for byte the stored one; a copy
// with another signature is not held).
func (r *Registry) Has(s *SignedEndorsement) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	x := r.ids[s.Endorsement.ID()]
	return x != nil && bytes.Equal(x.Sig, s.Sig)
}

// RecordsBy returns the wire bytes of the stored, unexpired
// endorsements that peer p signed (what a daemon republishes of its own).
func (r *Registry) RecordsBy(p peer.ID) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now().Unix()
	var out [][]byte
	for _, s := range r.recs {
		if now < s.Endorsement.Expires && s.Endorsement.Peer == p.String() {
			out = append(out, s.Encode())
		}
	}
	return out
}

// Endorsements returns the stored endorsements that have not expired,
// oldest first.
func (r *Registry) Endorsements() []Endorsement {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now().Unix()
	out := make([]Endorsement, 0, len(r.recs))
	for _, s := range r.recs {
		if now < s.Endorsement.Expires {
			out = append(out, s.Endorsement)
		}
	}
	return out
}

// Records returns the wire bytes of the stored endorsements that have not
// expired (what the daemon serves and republishes).
func (r *Registry) Records() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now().Unix()
	var out [][]byte
	for _, s := range r.recs {
		if now < s.Endorsement.Expires {
			out = append(out, s.Encode())
		}
	}
	return out
}

// ActiveAll returns op -> active variant for every op, Builtin where none
// was chosen.
func (r *Registry) ActiveAll() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for _, op := range Ops() {
		out[op] = Builtin
		if a, ok := r.st.Active[op]; ok {
			out[op] = a
		}
	}
	return out
}

// Dropped is how many stored records were refused when the registry was
// opened (bad, tampered or expired).
func (r *Registry) Dropped() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dropped
}

// Flush writes received endorsements that are not on disk yet.
func (r *Registry) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flushLocked()
}

// Close flushes. The registry stays usable (Close only makes sure nothing
// is left unwritten).
func (r *Registry) Close() error { return r.Flush() }

// verifySignature checks s's signature alone (stored records were fully
// verified when they arrived; the disk is checked, not trusted).
func verifySignature(s *SignedEndorsement) error {
	return checkSignature(&s.Endorsement, s.Sig)
}
