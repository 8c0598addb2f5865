package kernels

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rdrr/peer/internal/atomicfile"
)

// Registry is the peer's record of kernels: the active variant of each op
// (or "builtin"), the one before it (for rollback), and the endorsements
// received. It lives in one JSON file in the peer's home, replaced
// atomically on every change, so a crash leaves the old or the new state.
// Safe for concurrent use.
type Registry struct {
	path string
	mu   sync.Mutex
	st   registryState
}

type registryState struct {
	Active       map[string]string   `json:"active"`   // op -> descriptor CID or "builtin"
	Previous     map[string]string   `json:"previous"` // op -> what was active before
	Endorsements []SignedEndorsement `json:"endorsements"`
}

// Builtin names the built-in kernel of an op.
const Builtin = "builtin"

// MaxStoredEndorsements bounds the endorsements kept; expired ones go
// first, then the oldest.
const MaxStoredEndorsements = 4096

// OpenRegistry reads path, or starts an empty registry there.
func OpenRegistry(path string) (*Registry, error) {
	r := &Registry{path: path, st: registryState{Active: map[string]string{}, Previous: map[string]string{}}}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return r, nil
	case err != nil:
		return nil, err
	case len(b) > 64<<20:
		return nil, fmt.Errorf("%s: %d bytes", path, len(b))
	}
	if err := json.Unmarshal(b, &r.st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if r.st.Active == nil {
		r.st.Active = map[string]string{}
	}
	if r.st.Previous == nil {
		r.st.Previous = map[string]string{}
	}
	return r, nil
}

// save writes the state atomically.
func (r *Registry) save() error {
	b, err := json.MarshalIndent(&r.st, "", " ")
	if err != nil {
		return err
	}
	return atomicfile.Write(r.path, b, 0o644)
}

// Active returns the active variant of op ("builtin" if none was chosen).
func (r *Registry) Active(op string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a, ok := r.st.Active[op]; ok {
		return a
	}
	return Builtin
}

// Use makes variant (a descriptor CID, or "builtin") the active one of op,
// keeping the one before for Rollback. The caller has run the gate.
func (r *Registry) Use(op, variant string) error {
	if !validOp(op) {
		return fmt.Errorf("kernels: unknown op %q", op)
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
	r.st.Previous[op], r.st.Active[op] = prev, variant
	return r.save()
}

// Rollback makes the previous variant of op active again.
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
	r.st.Active[op], r.st.Previous[op] = prev, cur
	return prev, r.save()
}

// AddEndorsement stores a verified endorsement, dropping expired ones and
// then the oldest beyond MaxStoredEndorsements.
func (r *Registry) AddEndorsement(s *SignedEndorsement, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.st.Endorsements[:0]
	for _, e := range r.st.Endorsements {
		if e.Endorsement.Expires > now.Unix() {
			keep = append(keep, e)
		}
	}
	keep = append(keep, *s)
	if n := len(keep) - MaxStoredEndorsements; n > 0 {
		keep = keep[n:]
	}
	r.st.Endorsements = keep
	return r.save()
}

// Endorsements returns the stored endorsements.
func (r *Registry) Endorsements() []Endorsement {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Endorsement, len(r.st.Endorsements))
	for i, s := range r.st.Endorsements {
		out[i] = s.Endorsement
	}
	return out
}
