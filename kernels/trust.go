package kernels

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// Policy says which endorsements make a kernel a candidate to pull: a
// quorum of distinct endorsers, or one endorsement from a trusted key.
// Candidates are always re-checked by the local gate and benchmark before
// they are activated; the policy only decides what is worth trying.
type Policy struct {
	Quorum  int // distinct peers (default 2)
	Trusted map[peer.ID]bool
}

// ReadTrustedKeys parses a trusted-keys file: one peer ID per line; blank
// lines and lines starting with # are ignored. At most 1000 keys.
func ReadTrustedKeys(r io.Reader) (map[peer.ID]bool, error) {
	out := map[peer.ID]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024), 1024)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		id, err := peer.Decode(s)
		if err != nil {
			return nil, fmt.Errorf("trusted keys line %d: %v", line, err)
		}
		if len(out) >= 1000 {
			return nil, fmt.Errorf("trusted keys: more than 1000")
		}
		out[id] = true
	}
	return out, sc.Err()
}

// Candidate is a kernel variant that meets the policy for one op and
// shape bucket on this device class.
type Candidate struct {
	Kernel    cas.CID
	Op, Shape string
	Endorsers []string // distinct peer IDs, sorted
	Trusted   bool     // endorsed by a trusted key
	Speedup   float64  // the median of the endorsers' speedups
}

// Candidates groups verified endorsements (for this class: Verify checked
// it) by kernel, op and shape and returns those that meet p. The same peer
// endorsing a kernel many times counts once.
func (p Policy) Candidates(es []Endorsement) []Candidate {
	q := p.Quorum
	if q <= 0 {
		q = 2
	}
	type key struct {
		k         cas.CID
		op, shape string
	}
	by := map[key]map[string][]float64{}
	for _, e := range es {
		k := key{e.Kernel, e.Op, e.Shape}
		if by[k] == nil {
			by[k] = map[string][]float64{}
		}
		by[k][e.Peer] = append(by[k][e.Peer], e.Speedup)
	}
	var out []Candidate
	for k, peers := range by {
		c := Candidate{Kernel: k.k, Op: k.op, Shape: k.shape}
		var speedups []float64
		for pid, s := range peers {
			c.Endorsers = append(c.Endorsers, pid)
			speedups = append(speedups, s...)
			if id, err := peer.Decode(pid); err == nil && p.Trusted[id] {
				c.Trusted = true
			}
		}
		if len(c.Endorsers) < q && !c.Trusted {
			continue
		}
		sort.Strings(c.Endorsers)
		sort.Float64s(speedups)
		c.Speedup = speedups[len(speedups)/2]
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Speedup > out[j].Speedup })
	return out
}
