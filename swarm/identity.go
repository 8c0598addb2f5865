package swarm

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// IdentityFile is the name of the key file inside a peer's home.
const IdentityFile = "identity.key"

// Identity is a peer's Ed25519 key and the libp2p peer ID derived from it.
// The same key signs the signaling challenge, binds the WebRTC DTLS
// fingerprint, and signs kernel endorsements.
type Identity struct {
	Key crypto.PrivKey
	ID  peer.ID
}

// NewIdentity makes a fresh Ed25519 identity (not stored anywhere).
func NewIdentity() (*Identity, error) {
	sk, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate identity: %w", err)
	}
	return identityFromKey(sk)
}

func identityFromKey(sk crypto.PrivKey) (*Identity, error) {
	id, err := peer.IDFromPrivateKey(sk)
	if err != nil {
		return nil, fmt.Errorf("peer id: %w", err)
	}
	return &Identity{Key: sk, ID: id}, nil
}

// LoadIdentity reads home/identity.key. It refuses a key file that others
// can read.
func LoadIdentity(home string) (*Identity, error) {
	path := filepath.Join(home, IdentityFile)
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no identity at %s (run `peer init`): %w", path, err)
		}
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("identity %s has mode %v; want 0600 (chmod 600 it)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sk, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("identity %s: %w", path, err)
	}
	if sk.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("identity %s: key type %v; want Ed25519", path, sk.Type())
	}
	return identityFromKey(sk)
}

// InitIdentity loads home/identity.key, creating it (mode 0600) if it does
// not exist. It never overwrites an existing key; created reports whether a
// new key was written. The key is written to a temporary file, synced and
// linked into place, so a crash leaves either no key or a whole one.
func InitIdentity(home string) (id *Identity, created bool, err error) {
	path := filepath.Join(home, IdentityFile)
	if _, err := os.Lstat(path); err == nil {
		id, err := LoadIdentity(home)
		return id, false, err
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, false, err
	}
	id, err = NewIdentity()
	if err != nil {
		return nil, false, err
	}
	b, err := crypto.MarshalPrivateKey(id.Key)
	if err != nil {
		return nil, false, err
	}
	tmp, err := os.CreateTemp(home, ".identity-*.tmp")
	if err != nil {
		return nil, false, err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, false, err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, false, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, false, err
	}
	if err := tmp.Close(); err != nil {
		return nil, false, err
	}
	// Link fails if the key appeared meanwhile: never overwrite.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			id, err := LoadIdentity(home)
			return id, false, err
		}
		return nil, false, err
	}
	if d, err := os.Open(home); err == nil {
		d.Sync()
		d.Close()
	}
	return id, true, nil
}
