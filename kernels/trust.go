package kernels

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// Policy says which endorsements make a variant a candidate to pull: a
// quorum of distinct endorsers, or one endorsement from a trusted key.
// Candidates are always re-checked by the local gate and benchmark before
// they are activated; the policy only decides what is worth trying.
type Policy struct {
	Quorum    int              // distinct peers; 0 means 2
	Trusted   map[peer.ID]bool // one endorsement from any of these is enough
	AnyDriver bool             // count endorsements for the coarse class too
}

// MaxTrustedKeys bounds a trusted-keys file.
const MaxTrustedKeys = 1000

// ReadTrustedKeys parses a trusted-keys file: one peer ID per line;
// everything after a '#' is a comment; blank lines are ignored. Lines
// are at most 1 KiB, and there are at most MaxTrustedKeys keys.
func ReadTrustedKeys(r io.Reader) (map[peer.ID]bool, error) {
	out := map[peer.ID]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024), 1024)
	for line := 1; sc.Scan(); line++ {
		s, _, _ := strings.Cut(sc.Text(), "#")
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("trusted keys line %d: %v", line, err)
		}
		if _, err := id.ExtractPublicKey(); err != nil {
			return nil, fmt.Errorf("trusted keys line %d: %s embeds no public key", line, s)
		}
		if len(out) >= MaxTrustedKeys {
			return nil, fmt.Errorf("trusted keys: more than %d", MaxTrustedKeys)
		}
		out[id] = true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trusted keys: %w", err)
	}
	return out, nil
}

// Candidate is a variant that meets the policy for one op and shape
// bucket on this device class.
type Candidate struct {
	Kernel    cas.CID
	Op, Shape string
	Endorsers []string // distinct peer IDs, sorted
	Trusted   bool     // endorsed by a trusted key
	Speedup   float64  // the median of the endorsers' claims
}

// Candidates returns the variants of op (every op when op is "") that es
// endorse for class under p, at time now, fastest claim first. It counts
// only endorsements that are for this class, unexpired and meet the rule,
// so it can be given stored ones; a peer counts once per variant and
// shape however many records it signed. The signatures must have been
// verified (Verifier, or a Registry, which holds only verified ones).
func (p Policy) Candidates(es []Endorsement, class DeviceClass, op string, now time.Time) []Candidate {
	q := p.Quorum
	if q <= 0 {
		q = 2
	}
	type key struct {
		kernel    cas.CID
		op, shape string
	}
	by := map[key]map[string][]float64{}
	for _, e := range es {
		switch {
		case op != "" && e.Op != op,
			e.Class != class.Exact() && !(p.AnyDriver && e.Coarse == class.Coarse()),
			now.Unix() >= e.Expires, !e.Faster(), canonicalPeer(e.Peer) != nil:
			continue
		}
		k := key{e.Kernel, e.Op, e.Shape}
		if by[k] == nil {
			by[k] = map[string][]float64{}
		}
		by[k][e.Peer] = append(by[k][e.Peer], e.Speedup)
	}
	var out []Candidate
	for k, peers := range by {
		c := Candidate{Kernel: k.kernel, Op: k.op, Shape: k.shape}
		var claims []float64
		for pid, s := range peers {
			c.Endorsers = append(c.Endorsers, pid)
			claims = append(claims, s...)
			if id, err := peer.Decode(pid); err == nil && p.Trusted[id] {
				c.Trusted = true
			}
		}
		if len(c.Endorsers) < q && !c.Trusted {
			continue
		}
		sort.Strings(c.Endorsers)
		sort.Float64s(claims)
		c.Speedup = claims[len(claims)/2]
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Speedup != b.Speedup {
			return a.Speedup > b.Speedup
		}
		return a.Kernel.String()+a.Op+a.Shape < b.Kernel.String()+b.Op+b.Shape
	})
	return out
}
