package kernels

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

var update = flag.Bool("update", false, "rewrite testdata/endorsement-vector.json")

// testKey returns a deterministic Ed25519 key for seed.
func testKey(t testing.TB, seed uint64) (crypto.PrivKey, peer.ID) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	key, _, err := crypto.GenerateEd25519Key(readerFunc(func(p []byte) (int, error) {
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		return len(p), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	return key, id
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

const testClass = "vulkan/10de/2330/580.159.04"

var t0 = time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)

func sample(id peer.ID) Endorsement {
	return Endorsement{
		Version: Version, Kernel: cas.Sum([]byte("variant")), Op: "attention_decode", ABI: 1,
		Class: testClass, Coarse: "vulkan/10de/2330", Shape: "32x8x128x4096", Baseline: cas.Sum([]byte("builtin")),
		CandidateNs: 400_000, BaselineNs: 725_000, Speedup: 1.8125, SpeedupLow: 1.7, SpeedupHigh: 1.9,
		Seed: 42, Tool: "peer/0.2", Peer: id.String(), Issued: t0.Unix(), Expires: t0.Add(30 * 24 * time.Hour).Unix(), Nonce: 7,
	}
}

func verifier() *Verifier {
	return &Verifier{Class: testClass, ABI: map[string]int{"attention_decode": 1}, Now: func() time.Time { return t0.Add(time.Hour) }}
}

// The committed vector: its bytes decode, verify and re-encode to the
// same bytes; the signature is over the documented message.
func TestEndorsementVector(t *testing.T) {
	key, id := testKey(t, 1)
	s, err := Sign(sample(id), key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "endorsement-vector.json")
	if *update {
		os.MkdirAll("testdata", 0o755)
		msg := append([]byte(domain), s.Endorsement.Canonical()...)
		os.WriteFile(path, append(s.Encode(), '\n'), 0o644)
		os.WriteFile(filepath.Join("testdata", "endorsement-vector-message.hex"), []byte(hex.EncodeToString(msg)+"\n"), 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want = bytes.TrimSuffix(want, []byte("\n"))
	if !bytes.Equal(s.Encode(), want) {
		t.Fatalf("signing the sample gives\n%s\nthe vector is\n%s", s.Encode(), want)
	}
	got, err := Decode(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifier().Verify(got); err != nil {
		t.Fatal(err)
	}
	msgHex, _ := os.ReadFile(filepath.Join("testdata", "endorsement-vector-message.hex"))
	if hex.EncodeToString(append([]byte(domain), got.Endorsement.Canonical()...)) != string(bytes.TrimSpace(msgHex)) {
		t.Fatal("the signed message is not the documented one")
	}
}

// Every kind of bad record is refused with its own error.
func TestVerifyRejects(t *testing.T) {
	key, id := testKey(t, 1)
	other, _ := testKey(t, 2)
	for _, tc := range []struct {
		name string
		mod  func(e *Endorsement)
		sign crypto.PrivKey
		want error
	}{
		{"forged signature", nil, other, ErrSignature},
		{"wrong class", func(e *Endorsement) { e.Class = "vulkan/1002/73bf/x" }, key, ErrClass},
		{"wrong ABI", func(e *Endorsement) { e.ABI = 2 }, key, ErrABI},
		{"expired", func(e *Endorsement) { e.Issued, e.Expires = t0.Add(-48*time.Hour).Unix(), t0.Add(-time.Hour).Unix() }, key, ErrExpired},
		{"not faster", func(e *Endorsement) {
			e.CandidateNs, e.Speedup, e.SpeedupLow, e.SpeedupHigh = 700_000, 1.0357, 0.98, 1.1
		}, key, ErrNotFaster},
		{"speedup lies about times", func(e *Endorsement) { e.Speedup, e.SpeedupHigh = 3, 3.1 }, key, ErrSchema},
		{"unknown op", func(e *Endorsement) { e.Op = "mine" }, key, ErrSchema},
		{"too long lived", func(e *Endorsement) { e.Expires = t0.Add(365 * 24 * time.Hour).Unix() }, key, ErrSchema},
		{"from the future", func(e *Endorsement) { e.Issued, e.Expires = t0.Add(48*time.Hour).Unix(), t0.Add(72*time.Hour).Unix() }, key, ErrSchema},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := sample(id)
			if tc.mod != nil {
				tc.mod(&e)
			}
			var s *SignedEndorsement
			if tc.sign == other {
				s, _ = Sign(e, key)
				forged, _ := other.Sign(append([]byte(domain), e.Canonical()...))
				s.Sig = forged
			} else {
				s, _ = Sign(e, tc.sign)
			}
			if err := verifier().Verify(s); !errors.Is(err, tc.want) {
				t.Fatalf("Verify: %v; want %v", err, tc.want)
			}
		})
	}
	// Replayed: the same record twice.
	s, _ := Sign(sample(id), key)
	v := verifier()
	if err := v.Verify(s); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(s); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay: %v; want ErrReplay", err)
	}
	// Truncated and bit-flipped wire bytes.
	b := s.Encode()
	if _, err := Decode(b[:len(b)-3]); !errors.Is(err, ErrSchema) {
		t.Fatalf("truncated: %v", err)
	}
	flipped := bytes.Replace(b, []byte(`"nonce":7`), []byte(`"nonce":8`), 1)
	fs, err := Decode(flipped)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifier().Verify(fs); !errors.Is(err, ErrSignature) {
		t.Fatalf("a flipped field: %v; want ErrSignature", err)
	}
	spaced := bytes.Replace(b, []byte(`,"sig"`), []byte(`, "sig"`), 1)
	if _, err := Decode(spaced); !errors.Is(err, ErrSchema) {
		t.Fatalf("non-canonical bytes: %v; want ErrSchema", err)
	}
}

// Quorum counts distinct peers: ten records from one peer are one vote.
func TestQuorumCountsDistinctPeers(t *testing.T) {
	var es []Endorsement
	_, a := testKey(t, 1)
	_, b := testKey(t, 2)
	for i := 0; i < 10; i++ {
		e := sample(a)
		e.Nonce = uint64(i)
		es = append(es, e)
	}
	p := Policy{Quorum: 2}
	if c := p.Candidates(es); len(c) != 0 {
		t.Fatalf("10 endorsements from one peer made %d candidates; want none", len(c))
	}
	es = append(es, sample(b))
	c := p.Candidates(es)
	if len(c) != 1 || len(c[0].Endorsers) != 2 {
		t.Fatalf("two peers: %+v", c)
	}
	// One endorsement from a trusted key is enough.
	trusted := Policy{Quorum: 2, Trusted: map[peer.ID]bool{b: true}}
	if c := trusted.Candidates([]Endorsement{sample(b)}); len(c) != 1 || !c[0].Trusted {
		t.Fatalf("trusted key: %+v", c)
	}
}

func TestRegistryRollback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kernels.json")
	r, err := OpenRegistry(path)
	if err != nil {
		t.Fatal(err)
	}
	v1, v2 := cas.Sum([]byte("v1")).String(), cas.Sum([]byte("v2")).String()
	if r.Active("rmsnorm") != Builtin {
		t.Fatal("a fresh registry is not on the builtin")
	}
	r.Use("rmsnorm", v1)
	r.Use("rmsnorm", v2)
	// Reopened: the state survived.
	r, _ = OpenRegistry(path)
	if r.Active("rmsnorm") != v2 {
		t.Fatalf("active %s; want %s", r.Active("rmsnorm"), v2)
	}
	if prev, err := r.Rollback("rmsnorm"); err != nil || prev != v1 || r.Active("rmsnorm") != v1 {
		t.Fatalf("rollback: %s %v; active %s", prev, err, r.Active("rmsnorm"))
	}
	if _, err := r.Rollback("attention_decode"); err == nil {
		t.Fatal("rollback of an op never changed succeeded")
	}
	if err := r.Use("nope", v1); err == nil {
		t.Fatal("Use of an unknown op succeeded")
	}
}

// Gossip: A endorses, B (same class) verifies and stores it, C (another
// class) drops it; a forged record is dropped and counted by reason.
func TestGossipByClass(t *testing.T) {
	key, id := testKey(t, 1)
	g := &LocalGossip{From: id}
	vb := verifier()
	vc := &Verifier{Class: "vulkan/1002/73bf/x", ABI: map[string]int{"attention_decode": 1}, Now: vb.Now}
	rb, _ := OpenRegistry(filepath.Join(t.TempDir(), "b.json"))
	B := &Receiver{V: vb, Registry: rb}
	C := &Receiver{V: vc}
	topic := Topic("vulkan/10de/2330")
	g.Subscribe(topic, B.Handle)
	g.Subscribe(topic, C.Handle)
	s, _ := Sign(sample(id), key)
	g.Publish(topic, s.Encode())
	bad := *s
	bad.Sig = append([]byte(nil), s.Sig...)
	bad.Sig[0] ^= 1
	g.Publish(topic, bad.Encode())
	if B.Accepted != 1 || len(rb.Endorsements()) != 1 || B.Dropped[ErrSignature.Error()] != 1 {
		t.Fatalf("B accepted %d, stored %d, dropped %v", B.Accepted, len(rb.Endorsements()), B.Dropped)
	}
	if C.Accepted != 0 || C.Dropped[ErrClass.Error()] != 1 {
		t.Fatalf("C accepted %d, dropped %v", C.Accepted, C.Dropped)
	}
}

func FuzzEndorsement(f *testing.F) {
	key, id := testKey(f, 1)
	s, _ := Sign(sample(id), key)
	f.Add(s.Encode())
	f.Add([]byte(`{"endorsement":{},"sig":""}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			return
		}
		if !bytes.Equal(s.Encode(), b) {
			t.Fatal("decoded bytes re-encode differently")
		}
		v := verifier()
		if v.Verify(s) == nil && !s.Endorsement.Faster() {
			t.Fatal("verified an endorsement that is not faster")
		}
	})
}

func TestShapeBucketAndClass(t *testing.T) {
	if got := ShapeBucket(4000, 14000, 1); got != "4096x16384x1" {
		t.Fatalf("bucket %s", got)
	}
	c := DeviceClass{Backend: "Vulkan", Vendor: "10de", Device: "2330", Driver: "580.159.04 (NVIDIA)"}
	if c.Coarse() != "vulkan/10de/2330" || c.Exact() != "vulkan/10de/2330/580.159.04-nvidia" {
		t.Fatalf("class %q / %q", c.Coarse(), c.Exact())
	}
}
