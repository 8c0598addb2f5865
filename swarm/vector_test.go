package swarm

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
)

var update = flag.Bool("update", false, "rewrite the vectors under testdata/ from their seeds")

const bindingVectorFile = "testdata/binding-vector.json"

// bindingVector is the DTLS binding of PROTOCOL.md 2.2 worked through for
// fixed keys, session and SDP, for implementations in other languages.
// Byte strings are hex; data is the offer's signaling "data" as sent.
type bindingVector struct {
	Comment       string          `json:"comment"`
	FromSeed      string          `json:"from_seed"` // Ed25519 private key seed (RFC 8032) of the sender
	ToSeed        string          `json:"to_seed"`   // of the receiver (only its peer ID is used)
	From          string          `json:"from"`
	To            string          `json:"to"`
	Kind          string          `json:"kind"`
	SID           string          `json:"sid"`
	SDP           string          `json:"sdp"`
	Caps          linkCaps        `json:"caps"`
	SignedPayload string          `json:"signed_payload"`     // the exact UTF-8 bytes signed
	PayloadHex    string          `json:"signed_payload_hex"` // the same, hex
	Signature     string          `json:"signature"`          // Ed25519, deterministic
	Data          json.RawMessage `json:"data"`               // {"sdp","caps","sig"}: sig in standard padded base64
}

func vectorIdentity(t testing.TB, seed []byte) *Identity {
	t.Helper()
	k, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(seed))
	if err != nil {
		t.Fatal(err)
	}
	id, err := identityFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// vectorSDP has a session-level and a media-level fingerprint, in mixed
// case, to show normalization and sorting.
const vectorSDP = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n" +
	"a=fingerprint:sha-256 9F:86:D0:81:88:4C:7D:65:9A:2F:EA:A0:C5:5A:D0:15:A3:BF:4F:1B:2B:0B:82:2C:D1:5D:6C:15:B0:F0:0A:08\r\n" +
	"m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\nc=IN IP4 0.0.0.0\r\n" +
	"a=fingerprint:sha-256 2c:26:b4:6b:68:ff:c6:8f:f9:9b:45:3c:1d:30:41:34:13:42:2d:70:64:83:bf:a0:f9:8a:5e:88:62:66:e7:ae\r\n" +
	"a=sctp-port:5000\r\na=max-message-size:262144\r\n"

func makeBindingVector(t testing.TB, fromSeed, toSeed []byte, sid string) bindingVector {
	t.Helper()
	from, to := vectorIdentity(t, fromSeed), vectorIdentity(t, toSeed)
	// The vector's own recv_mtu (what the reference announced when it was
	// made), fixed so that the published vector does not move with it.
	caps := linkCaps{Bulk: 2, RecvMTU: 16384}
	payload := bindingPayload("offer", sid, from.ID, to.ID, sdpFingerprints(vectorSDP), caps)
	sig, err := from.Key.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	data, err := signDescription(from.Key, "offer", sid, from.ID, to.ID, vectorSDP, caps)
	if err != nil {
		t.Fatal(err)
	}
	return bindingVector{
		Comment:       "rdrr swarm protocol v1 DTLS binding (swarm/PROTOCOL.md 2.2) of an offer. Byte strings are hex; data.sig is the signature in standard padded base64.",
		FromSeed:      hex.EncodeToString(fromSeed),
		ToSeed:        hex.EncodeToString(toSeed),
		From:          from.ID.String(),
		To:            to.ID.String(),
		Kind:          "offer",
		SID:           sid,
		SDP:           vectorSDP,
		Caps:          caps,
		SignedPayload: string(payload),
		PayloadHex:    hex.EncodeToString(payload),
		Signature:     hex.EncodeToString(sig),
		Data:          data,
	}
}

// The binding vector in testdata/ is what this code signs, and verifies.
func TestBindingVector(t *testing.T) {
	if *update {
		from, to := make([]byte, ed25519.SeedSize), make([]byte, ed25519.SeedSize)
		for i := range from {
			from[i], to[i] = byte(i), byte(0x20+i)
		}
		b, err := json.MarshalIndent(makeBindingVector(t, from, to, "0123456789abcdef01234567"), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bindingVectorFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bindingVectorFile)
	if err != nil {
		t.Fatal(err)
	}
	var file bindingVector
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	fromSeed, err1 := hex.DecodeString(file.FromSeed)
	toSeed, err2 := hex.DecodeString(file.ToSeed)
	if err1 != nil || err2 != nil || len(fromSeed) != ed25519.SeedSize || len(toSeed) != ed25519.SeedSize {
		t.Fatalf("seeds %q, %q: want %d hex bytes each", file.FromSeed, file.ToSeed, ed25519.SeedSize)
	}
	want := makeBindingVector(t, fromSeed, toSeed, file.SID)
	for _, f := range []struct{ name, got, want string }{
		{"from", file.From, want.From},
		{"to", file.To, want.To},
		{"sdp", file.SDP, want.SDP},
		{"signed_payload", file.SignedPayload, want.SignedPayload},
		{"signed_payload_hex", file.PayloadHex, want.PayloadHex},
		{"signature", file.Signature, want.Signature},
	} {
		if f.got != f.want {
			t.Errorf("%s = %q; want %q", f.name, f.got, f.want)
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, file.Data); err != nil || compact.String() != string(want.Data) {
		t.Errorf("data = %s; want %s", file.Data, want.Data)
	}
	// data.sig is the signature in standard, padded base64.
	var d struct{ Sig string }
	sig, _ := hex.DecodeString(file.Signature)
	if err := json.Unmarshal(file.Data, &d); err != nil || d.Sig != base64.StdEncoding.EncodeToString(sig) {
		t.Errorf("data.sig = %q; want %q", d.Sig, base64.StdEncoding.EncodeToString(sig))
	}
	// The receiver accepts it for this session, and nothing else.
	from, to := vectorIdentity(t, fromSeed), vectorIdentity(t, toSeed)
	if _, fps, err := verifyDescription(file.Data, "offer", file.SID, from.ID, to.ID); err != nil || len(fps) != 2 {
		t.Fatalf("verify = %v, %v", fps, err)
	}
	if _, _, err := verifyDescription(file.Data, "offer", file.SID+"x", from.ID, to.ID); !errors.Is(err, ErrIdentity) {
		t.Fatalf("verify for another session: %v; want ErrIdentity", err)
	}
}
