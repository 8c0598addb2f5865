package kernels

import (
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Quorum counts distinct peers: ten records from one peer, with ten
// nonces, are one vote.
func TestQuorumCountsDistinctPeers(t *testing.T) {
	_, a := testKey(t, 1)
	_, b := testKey(t, 2)
	now := t0.Add(time.Hour)
	var es []Endorsement
	for i := range 10 {
		e := sample(a)
		e.Nonce = uint64(i)
		e.Speedup, e.CandidateNs = 1.8+float64(i)/100, int64(725_000/(1.8+float64(i)/100))
		e.SpeedupHigh = 2
		es = append(es, e)
	}
	p := Policy{Quorum: 2}
	if c := p.Candidates(es, testClass, "attention_decode", now); len(c) != 0 {
		t.Fatalf("10 endorsements from one peer made %d candidates; want none", len(c))
	}
	es = append(es, sample(b))
	c := p.Candidates(es, testClass, "attention_decode", now)
	if len(c) != 1 || len(c[0].Endorsers) != 2 || c[0].Kernel != es[0].Kernel {
		t.Fatalf("two peers: %+v", c)
	}
	if p3 := (Policy{Quorum: 3}); len(p3.Candidates(es, testClass, "", now)) != 0 {
		t.Fatal("two peers met a quorum of 3")
	}
	// The default quorum is 2.
	if c := (Policy{}).Candidates(es, testClass, "", now); len(c) != 1 {
		t.Fatalf("default quorum: %+v", c)
	}
}

// One endorsement from a trusted key is enough; from an untrusted one it
// is not.
func TestTrustedKey(t *testing.T) {
	_, a := testKey(t, 1)
	_, b := testKey(t, 2)
	now := t0.Add(time.Hour)
	trusted := Policy{Quorum: 2, Trusted: map[peer.ID]bool{b: true}}
	if c := trusted.Candidates([]Endorsement{sample(b)}, testClass, "attention_decode", now); len(c) != 1 || !c[0].Trusted {
		t.Fatalf("trusted key: %+v", c)
	}
	if c := trusted.Candidates([]Endorsement{sample(a)}, testClass, "attention_decode", now); len(c) != 0 {
		t.Fatalf("untrusted key alone: %+v", c)
	}
}

// Candidates counts only endorsements for this class and op, unexpired,
// and meeting the rule; shapes are separate candidates.
func TestCandidatesFilter(t *testing.T) {
	_, a := testKey(t, 1)
	_, b := testKey(t, 2)
	now := t0.Add(time.Hour)
	p := Policy{Quorum: 2}
	pair := func(mod func(*Endorsement)) []Endorsement {
		ea, eb := sample(a), sample(b)
		mod(&ea)
		mod(&eb)
		return []Endorsement{ea, eb}
	}
	for _, tc := range []struct {
		name string
		mod  func(*Endorsement)
		op   string
		want int
	}{
		{"valid", func(*Endorsement) {}, "attention_decode", 1},
		{"every op", func(*Endorsement) {}, "", 1},
		{"another op asked", func(*Endorsement) {}, "rmsnorm", 0},
		{"another class", func(e *Endorsement) { e.Class, e.Coarse = otherClass.Exact(), otherClass.Coarse() }, "", 0},
		{"another driver", func(e *Endorsement) { e.Class = testClass.Coarse() + "/1.0" }, "", 0},
		{"expired", func(e *Endorsement) { e.Expires = now.Unix() }, "", 0},
		{"not faster", func(e *Endorsement) { e.SpeedupLow = 0.9 }, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c := p.Candidates(pair(tc.mod), testClass, tc.op, now); len(c) != tc.want {
				t.Fatalf("%d candidates; want %d: %+v", len(c), tc.want, c)
			}
		})
	}
	// Two peers on two different shapes are two single votes.
	ea, eb := sample(a), sample(b)
	eb.Shape = "64x8x128x4096"
	if c := p.Candidates([]Endorsement{ea, eb}, testClass, "", now); len(c) != 0 {
		t.Fatalf("one vote per shape met quorum 2: %+v", c)
	}
	// AnyDriver counts the same device under another driver.
	eb = sample(b)
	eb.Class = testClass.Coarse() + "/1.0"
	if c := (Policy{AnyDriver: true}).Candidates([]Endorsement{ea, eb}, testClass, "", now); len(c) != 1 {
		t.Fatalf("AnyDriver: %+v", c)
	}
}

func TestReadTrustedKeys(t *testing.T) {
	_, a := testKey(t, 1)
	_, b := testKey(t, 2)
	file := "# team keys\n\n" + a.String() + "\n  " + b.String() + "  # lab machine\n# " + "not-a-key\n"
	keys, err := ReadTrustedKeys(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || !keys[a] || !keys[b] {
		t.Fatalf("keys %v", keys)
	}
	for _, bad := range []string{"not-a-key\n", a.String() + " extra\n", strings.Repeat("x", 2000) + "\n"} {
		if _, err := ReadTrustedKeys(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %.40q", bad)
		}
	}
	var many strings.Builder
	for i := range MaxTrustedKeys + 1 {
		many.WriteString(idN(t, i).String() + "\n")
	}
	if _, err := ReadTrustedKeys(strings.NewReader(many.String())); err == nil {
		t.Fatalf("accepted more than %d keys", MaxTrustedKeys)
	}
}
