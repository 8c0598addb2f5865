package kernels

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

const (
	vectorFile  = "testdata/endorsement-vector.json"
	messageFile = "testdata/endorsement-vector-message.hex"
	invalidFile = "testdata/endorsement-invalid.json"
	keyInfoFile = "testdata/endorsement-vector-key.txt"
)

// vectorABI is the ABI of the vectors' op (attention_decode): this
// build's, so that a bump regenerates them (-update) and edits no test.
var vectorABI = ABIVersion("attention_decode")

// The committed vector: signing the sample with the seed-1 key gives its
// bytes exactly; they decode, verify and re-encode to the same bytes; the
// signature is over the documented message.
func TestEndorsementVector(t *testing.T) {
	key, id := testKey(t, 1)
	s := signed(t, sample(id), key)
	msg := s.Endorsement.message()
	if *update {
		raw, _ := key.Raw()
		pub, _ := key.GetPublic().Raw()
		info := "seed " + hex.EncodeToString(raw[:32]) + "\npublic key " + hex.EncodeToString(pub) + "\npeer " + id.String() + "\nverified as " + fmt.Sprintf("class vulkan/10de/2330/580.159.04, attention_decode ABI %d, now 2026-11-23T01:00:00Z", vectorABI) + "\n"
		writeGolden(t, keyInfoFile, []byte(info))
		writeGolden(t, vectorFile, append(s.Encode(), '\n'))
		writeGolden(t, messageFile, []byte(hex.EncodeToString(msg)+"\n"))
	}
	want := bytes.TrimSuffix(readGolden(t, vectorFile), []byte("\n"))
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
	if hex.EncodeToString(got.Endorsement.message()) != string(bytes.TrimSpace(readGolden(t, messageFile))) {
		t.Fatal("the signed message is not the documented one")
	}
	if !strings.HasPrefix(string(msg), fmt.Sprintf("rdrr-endorsement-v1\x00{\"abi\":%d,", vectorABI)) {
		t.Fatalf("message starts %q", msg[:30])
	}
}

// The canonical bytes are RFC 8785: what a generic JSON value with sorted
// keys encodes to (checked with a map, whose keys encoding/json sorts,
// not with the struct).
func TestCanonicalIsSortedJSON(t *testing.T) {
	_, id := testKey(t, 1)
	e := sample(id)
	for _, b := range [][]byte{e.Canonical(), signed(t, e, mustKey(t, 1)).Encode()} {
		var v any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		again, _ := json.Marshal(v)
		if !bytes.Equal(again, b) {
			t.Fatalf("not in sorted canonical form:\n%s\n%s", b, again)
		}
	}
}

func mustKey(t *testing.T, n byte) crypto.PrivKey { k, _ := testKey(t, n); return k }

// invalidCase is a record and the error it must get.
type invalidCase struct {
	name string
	mod  func(e *Endorsement)
	sign func(e Endorsement) *SignedEndorsement // nil: sign with the seed-1 key
	want error
}

func invalidCases(t *testing.T) []invalidCase {
	key, id := testKey(t, 1)
	other, _ := testKey(t, 2)
	raw := func(e Endorsement, k crypto.PrivKey) *SignedEndorsement {
		sig, err := k.Sign(e.message())
		if err != nil {
			t.Fatal(err)
		}
		return &SignedEndorsement{Endorsement: e, Sig: sig}
	}
	return []invalidCase{
		{"forged signature", nil, func(e Endorsement) *SignedEndorsement { return raw(e, other) }, ErrSignature},
		{"signature without the domain", nil, func(e Endorsement) *SignedEndorsement {
			sig, _ := key.Sign(e.Canonical())
			return &SignedEndorsement{Endorsement: e, Sig: sig}
		}, ErrSignature},
		{"wrong class", func(e *Endorsement) { e.Class, e.Coarse = otherClass.Exact(), otherClass.Coarse() }, nil, ErrClass},
		{"other driver", func(e *Endorsement) { e.Class = testClass.Coarse() + "/999.1" }, nil, ErrClass},
		{"wrong ABI", func(e *Endorsement) { e.ABI = 1 }, nil, ErrABI},
		{"expired", func(e *Endorsement) { e.Issued, e.Expires = t0.Add(-48*time.Hour).Unix(), t0.Add(-time.Hour).Unix() }, nil, ErrExpired},
		{"not yet valid", func(e *Endorsement) { e.Issued, e.Expires = t0.Add(48*time.Hour).Unix(), t0.Add(72*time.Hour).Unix() }, nil, ErrNotYetValid},
		{"not faster", func(e *Endorsement) {
			e.CandidateNs, e.Speedup, e.SpeedupLow, e.SpeedupHigh = 700_000, 1.0357, 0.98, 1.1
		}, nil, ErrNotFaster},
		{"interval reaches 1", func(e *Endorsement) {
			e.CandidateNs, e.Speedup, e.SpeedupLow, e.SpeedupHigh = 580_000, 1.25, 1.0, 1.5
		}, nil, ErrNotFaster},
		{"speedup lies about times", func(e *Endorsement) { e.Speedup, e.SpeedupHigh = 3, 3.1 }, nil, ErrSchema},
		{"speedup outside interval", func(e *Endorsement) { e.SpeedupLow = 1.85 }, nil, ErrSchema},
		{"unknown op", func(e *Endorsement) { e.Op = "mine" }, nil, ErrSchema},
		{"shape of another op", func(e *Endorsement) { e.Shape = "4096x4096" }, nil, ErrSchema},
		{"shape not a bucket", func(e *Endorsement) { e.Shape = "32x8x128x4000" }, nil, ErrSchema},
		{"kernel is its baseline", func(e *Endorsement) { e.Kernel = e.Baseline }, nil, ErrSchema},
		{"coarse class not the class's", func(e *Endorsement) { e.Coarse = otherClass.Coarse() }, nil, ErrSchema},
		{"class with spaces", func(e *Endorsement) { e.Class = testClass.Coarse() + "/580 NVIDIA" }, nil, ErrSchema},
		{"too long lived", func(e *Endorsement) { e.Expires = t0.Add(365 * 24 * time.Hour).Unix() }, nil, ErrSchema},
		{"nonce beyond 2^53", func(e *Endorsement) { e.Nonce = 1 << 60 }, nil, ErrSchema},
		{"tool with quotes", func(e *Endorsement) { e.Tool = `peer "0.2"` }, nil, ErrSchema},
		{"version 2", func(e *Endorsement) { e.Version = 2 }, nil, ErrSchema},
		// One key, two spellings of its peer ID: it must not count as two
		// endorsers.
		{"peer ID as a CID", func(e *Endorsement) { e.Peer = peer.ToCid(id).String() }, func(e Endorsement) *SignedEndorsement { return raw(e, key) }, ErrSchema},
	}
}

// build makes tc's record.
func (tc invalidCase) build(t *testing.T) *SignedEndorsement {
	key, id := testKey(t, 1)
	e := sample(id)
	if tc.mod != nil {
		tc.mod(&e)
	}
	if tc.sign != nil {
		return tc.sign(e)
	}
	sig, err := key.Sign(e.message()) // not Sign: it refuses malformed records
	if err != nil {
		t.Fatal(err)
	}
	return &SignedEndorsement{Endorsement: e, Sig: sig}
}

// check runs a record through the receiving path: Decode, then Verify.
func check(v *Verifier, b []byte) error {
	s, err := Decode(b)
	if err != nil {
		return err
	}
	return v.Verify(s)
}

// Every kind of bad record is refused with its own error, both from the
// struct and from its wire bytes; the committed negative vectors get the
// same errors.
func TestVerifyRejects(t *testing.T) {
	type vector struct {
		Name   string `json:"name"`
		Record string `json:"record"`
		Error  string `json:"error"`
	}
	var vectors []vector
	for _, tc := range invalidCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.build(t)
			if err := verifier().Verify(s); !errors.Is(err, tc.want) {
				t.Fatalf("Verify: %v; want %v", err, tc.want)
			}
			if err := check(verifier(), s.Encode()); !errors.Is(err, tc.want) {
				t.Fatalf("Decode+Verify: %v; want %v", err, tc.want)
			}
			vectors = append(vectors, vector{tc.name, string(s.Encode()), tc.want.Error()})
		})
	}
	if *update {
		b, _ := json.MarshalIndent(vectors, "", "  ")
		writeGolden(t, invalidFile, append(b, '\n'))
	}
	var golden []vector
	if err := json.Unmarshal(readGolden(t, invalidFile), &golden); err != nil {
		t.Fatal(err)
	}
	if len(golden) != len(vectors) {
		t.Fatalf("%d negative vectors committed; %d cases (run with -update)", len(golden), len(vectors))
	}
	for _, g := range golden {
		if err := check(verifier(), []byte(g.Record)); err == nil || !strings.HasPrefix(err.Error(), g.Error) {
			t.Errorf("vector %q: %v; want %q", g.Name, err, g.Error)
		}
	}
}

// Sign refuses what Verify would refuse as malformed, and a key that is
// not the named peer's.
func TestSignChecks(t *testing.T) {
	key, id := testKey(t, 1)
	other, _ := testKey(t, 2)
	e := sample(id)
	if _, err := Sign(e, other); err == nil {
		t.Fatal("signed a record naming another peer")
	}
	e.Shape = "3x3"
	if _, err := Sign(e, key); !errors.Is(err, ErrSchema) {
		t.Fatalf("Sign of a bad shape: %v; want ErrSchema", err)
	}
}

func TestReplay(t *testing.T) {
	key, id := testKey(t, 1)
	s := signed(t, sample(id), key)
	v := verifier()
	if err := v.Verify(s); err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(s); !errors.Is(err, ErrReplay) {
		t.Fatalf("the same record again: %v; want ErrReplay", err)
	}
	// Another record with the same nonce is a replay too: a peer never
	// reuses one.
	e := sample(id)
	e.Shape = "64x8x128x4096"
	if err := v.Verify(signed(t, e, key)); !errors.Is(err, ErrReplay) {
		t.Fatalf("a new record with a used nonce: %v; want ErrReplay", err)
	}
	e.Nonce = 8
	if err := v.Verify(signed(t, e, key)); err != nil {
		t.Fatalf("a new nonce: %v", err)
	}
	// Another peer may use the same nonce.
	key2, id2 := testKey(t, 2)
	if err := v.Verify(signed(t, sample(id2), key2)); err != nil {
		t.Fatalf("another peer's nonce 7: %v", err)
	}
}

// The seen-set stays within MaxSeen, dropping the entries that expire
// first, and still catches a replay of what it keeps.
func TestReplaySetBounded(t *testing.T) {
	key, id := testKey(t, 1)
	v := verifier()
	v.MaxSeen = 4
	var recs []*SignedEndorsement
	for i := range 10 {
		e := sample(id)
		e.Nonce = uint64(i)
		e.Expires = t0.Add(time.Duration(24*(i+1)) * time.Hour).Unix()
		s := signed(t, e, key)
		if err := v.Verify(s); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, s)
	}
	if n := len(v.seen.keys); n != 4 || v.seen.h.Len() != 4 {
		t.Fatalf("seen-set holds %d keys, %d heap entries; want 4", n, v.seen.h.Len())
	}
	if err := v.Verify(recs[9]); !errors.Is(err, ErrReplay) {
		t.Fatalf("replay of the latest: %v; want ErrReplay", err)
	}
	// The earliest expiring was dropped: it verifies again (the registry
	// keeps one copy, the policy counts its peer once).
	if err := v.Verify(recs[0]); err != nil {
		t.Fatalf("evicted record: %v", err)
	}
}

// Truncated records and every single flipped bit are refused.
func TestTruncatedAndBitFlipped(t *testing.T) {
	key, id := testKey(t, 1)
	b := signed(t, sample(id), key).Encode()
	for n := range len(b) {
		if _, err := Decode(b[:n]); !errors.Is(err, ErrSchema) {
			t.Fatalf("truncated to %d bytes: %v; want ErrSchema", n, err)
		}
	}
	for i := range len(b) {
		for bit := range 8 {
			c := bytes.Clone(b)
			c[i] ^= 1 << bit
			if err := check(verifier(), c); err == nil {
				t.Fatalf("byte %d bit %d flipped (%q): accepted", i, bit, c[max(0, i-10):min(len(c), i+10)])
			} else if !errors.Is(err, ErrInvalid) {
				t.Fatalf("byte %d bit %d: %v does not wrap ErrInvalid", i, bit, err)
			}
		}
	}
	for _, tc := range []struct{ name, from, to string }{
		{"space", `,"sig"`, `, "sig"`},
		{"escaped character", `"op":"attention_decode"`, `"op":"attention\u005fdecode"`},
		{"upper-case key", `"nonce":7`, `"Nonce":7`},
		{"duplicate key", `"nonce":7`, `"nonce":7,"nonce":7`},
		{"unknown field", `"nonce":7`, `"nonce":7,"x":1`},
		{"number as float", `"nonce":7`, `"nonce":7.0`},
		{"trailing data", `"}`, `"} {}`},
	} {
		c := bytes.Replace(b, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(c, b) {
			t.Fatalf("%s: no change", tc.name)
		}
		if _, err := Decode(c); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: %v; want ErrSchema", tc.name, err)
		}
	}
	if _, err := Decode(append(bytes.Repeat([]byte(" "), MaxEndorsementBytes), b...)); !errors.Is(err, ErrSchema) {
		t.Fatalf("oversized: %v", err)
	}
}

// AnyDriver accepts the same device under another driver, never another
// device.
func TestVerifyAnyDriver(t *testing.T) {
	key, id := testKey(t, 1)
	e := sample(id)
	e.Class = testClass.Coarse() + "/999.1"
	v := verifier()
	v.AnyDriver = true
	if err := v.Verify(signed(t, e, key)); err != nil {
		t.Fatal(err)
	}
	e.Class, e.Coarse, e.Nonce = otherClass.Exact(), otherClass.Coarse(), 8
	if err := v.Verify(signed(t, e, key)); !errors.Is(err, ErrClass) {
		t.Fatalf("another device with AnyDriver: %v; want ErrClass", err)
	}
}

func FuzzEndorsement(f *testing.F) {
	key, id := testKey(f, 1)
	f.Add(signed(f, sample(id), key).Encode())
	f.Add([]byte(`{"endorsement":{},"sig":""}`))
	if b, err := os.ReadFile(invalidFile); err == nil {
		var vs []struct{ Record string }
		json.Unmarshal(b, &vs)
		for _, v := range vs {
			f.Add([]byte(v.Record))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("Decode error %v does not wrap ErrSchema", err)
			}
			return
		}
		if !bytes.Equal(s.Encode(), b) {
			t.Fatal("decoded bytes re-encode differently")
		}
		err = verifier().Verify(s)
		if err == nil && (!s.Endorsement.Faster() || s.Endorsement.Class != testClass.Exact()) {
			t.Fatal("verified an endorsement that breaks the rule or is for another class")
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("Verify error %v does not wrap ErrInvalid", err)
		}
	})
}

func readGolden(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./kernels -run %s -update)", err, t.Name())
	}
	return b
}

func writeGolden(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
