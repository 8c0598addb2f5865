package kernels

import (
	"bytes"
	"crypto/ed25519"
	"encoding/binary"
	"flag"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// testKey returns the Ed25519 key whose 32-byte seed is the byte n
// repeated (ENDORSEMENT.md's test vectors use n = 1).
func testKey(t testing.TB, n byte) (crypto.PrivKey, peer.ID) {
	t.Helper()
	key, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{n}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, id
}

// keyN returns a key seeded by i (distinct for each i, and from testKey's).
func keyN(t testing.TB, i int) (crypto.PrivKey, peer.ID) {
	t.Helper()
	seed := make([]byte, 32)
	binary.BigEndian.PutUint64(seed, uint64(i)+1<<32)
	key, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	return key, id
}

func idN(t testing.TB, i int) peer.ID { _, id := keyN(t, i); return id }

var (
	testClass  = DeviceClass{Backend: "vulkan", Vendor: "10de", Device: "2330", Driver: "580.159.04"}
	otherClass = DeviceClass{Backend: "vulkan", Vendor: "1002", Device: "73bf", Driver: "24.1"}
	// t0 is when the sample endorsements were issued.
	t0 = time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
)

// sample is a valid endorsement by id (the vector's fields).
func sample(id peer.ID) Endorsement {
	return Endorsement{
		Version: Version, Kernel: cas.Sum([]byte("variant")), Op: "attention_decode", ABI: vectorABI,
		Class: testClass.Exact(), Coarse: testClass.Coarse(), Shape: "32x8x128x4096", Baseline: cas.Sum([]byte("builtin")),
		CandidateNs: 400_000, BaselineNs: 725_000, Speedup: 1.8125, SpeedupLow: 1.7, SpeedupHigh: 1.9,
		Seed: 42, Tool: "peer/0.2", Peer: id.String(), Issued: t0.Unix(), Expires: t0.Add(30 * 24 * time.Hour).Unix(), Nonce: 7,
	}
}

// signed signs e with key, or fails the test.
func signed(t testing.TB, e Endorsement, key crypto.PrivKey) *SignedEndorsement {
	t.Helper()
	s, err := Sign(e, key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// at is a clock stopped at t.
func at(t time.Time) func() time.Time { return func() time.Time { return t } }

// verifier is this device (testClass, this build's ABIs) an hour after t0.
func verifier() *Verifier {
	return &Verifier{Class: testClass, ABI: ABIVersions(), Now: at(t0.Add(time.Hour))}
}
