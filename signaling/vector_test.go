package signaling

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

var update = flag.Bool("update", false, "rewrite testdata/auth-vector.json from its seed and nonce")

const authVectorFile = "testdata/auth-vector.json"

// authVector is the signaling login of PROTOCOL.md ("Session") worked
// through for one fixed key and nonce, for implementations in other
// languages. Byte strings are hex; "auth" is the message a client sends.
type authVector struct {
	Comment       string          `json:"comment"`
	Seed          string          `json:"seed"`              // Ed25519 private key seed (RFC 8032)
	PublicKey     string          `json:"public_key"`        // raw Ed25519 public key
	Libp2pPubKey  string          `json:"libp2p_public_key"` // protobuf PublicKey, what "pub" would carry
	PeerID        string          `json:"peer_id"`
	Nonce         string          `json:"nonce"`          // from "challenge"
	SignedPayload string          `json:"signed_payload"` // "rdrr-signal/1 auth\n" || nonce
	Signature     string          `json:"signature"`      // Ed25519, deterministic
	Auth          json.RawMessage `json:"auth"`
}

// makeAuthVector computes every derived field from seed and nonce.
func makeAuthVector(t *testing.T, seed, nonce []byte) authVector {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(seed)
	k, err := crypto.UnmarshalEd25519PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := crypto.MarshalPublicKey(k.GetPublic())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := k.Sign(AuthPayload(nonce))
	if err != nil {
		t.Fatal(err)
	}
	auth, err := (&Message{Type: TypeAuth, V: Version, ID: id.String(), Sig: sig}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	return authVector{
		Comment:       "rdrr signaling protocol v1 login (signaling/PROTOCOL.md, Session). Byte strings are hex; auth.sig is the signature in standard padded base64.",
		Seed:          hex.EncodeToString(seed),
		PublicKey:     hex.EncodeToString(priv.Public().(ed25519.PublicKey)),
		Libp2pPubKey:  hex.EncodeToString(pub),
		PeerID:        id.String(),
		Nonce:         hex.EncodeToString(nonce),
		SignedPayload: hex.EncodeToString(AuthPayload(nonce)),
		Signature:     hex.EncodeToString(sig),
		Auth:          auth,
	}
}

func TestAuthVector(t *testing.T) {
	if *update {
		seed, nonce := make([]byte, ed25519.SeedSize), make([]byte, NonceSize)
		for i := range seed {
			seed[i], nonce[i] = byte(i), byte(0xa0+i)
		}
		b, err := json.MarshalIndent(makeAuthVector(t, seed, nonce), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(authVectorFile, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(authVectorFile)
	if err != nil {
		t.Fatal(err)
	}
	var file authVector
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	seed, err1 := hex.DecodeString(file.Seed)
	nonce, err2 := hex.DecodeString(file.Nonce)
	if err1 != nil || err2 != nil || len(seed) != ed25519.SeedSize || len(nonce) != NonceSize {
		t.Fatalf("seed %q, nonce %q: want %d and %d hex bytes", file.Seed, file.Nonce, ed25519.SeedSize, NonceSize)
	}
	want := makeAuthVector(t, seed, nonce)
	want.Comment = file.Comment
	for _, f := range []struct{ name, got, want string }{
		{"public_key", file.PublicKey, want.PublicKey},
		{"libp2p_public_key", file.Libp2pPubKey, want.Libp2pPubKey},
		{"peer_id", file.PeerID, want.PeerID},
		{"signed_payload", file.SignedPayload, want.SignedPayload},
		{"signature", file.Signature, want.Signature},
	} {
		if f.got != f.want {
			t.Errorf("%s = %s; want %s", f.name, f.got, f.want)
		}
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, file.Auth); err != nil || compact.String() != string(want.Auth) {
		t.Errorf("auth = %s; want %s", file.Auth, want.Auth)
	}
	// The server accepts the auth message for this nonce, and only for it.
	m, err := DecodeMessage(file.Auth)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := VerifyAuth(m, nonce); err != nil || id.String() != file.PeerID {
		t.Fatalf("VerifyAuth = %v, %v; want %s", id, err, file.PeerID)
	}
	nonce[0] ^= 1
	if _, err := VerifyAuth(m, nonce); err == nil {
		t.Fatal("VerifyAuth accepted the signature for another nonce")
	}
}
