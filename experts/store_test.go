package experts

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdrr/peer/cas"
)

// writeTiny writes a tiny-moe model into a new directory.
func writeTiny(t *testing.T, seed uint64) (string, *Manifest) {
	t.Helper()
	p, _ := PresetByName("tiny-moe")
	lo, err := NewLayout(p, seed)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := lo.WriteModel(context.Background(), dir, false, nil); err != nil {
		t.Fatal(err)
	}
	return dir, lo.Manifest
}

func openStore(t testing.TB) *cas.Store {
	t.Helper()
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestAddAndLoadModel(t *testing.T) {
	dir, want := writeTiny(t, 5)
	st := openStore(t)
	info, m, err := AddModel(context.Background(), st, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !info.CID.IsCollection() {
		t.Fatalf("model CID %s is not a collection", info.CID)
	}
	got, err := LoadManifest(st, info.CID)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := got.Encode()
	b, _ := want.Encode()
	c, _ := m.Encode()
	if string(a) != string(b) || string(a) != string(c) {
		t.Fatal("the loaded manifest differs from the written one")
	}
	// The shards are the collection's, readable and verified.
	col, err := st.Collection(info.CID)
	if err != nil {
		t.Fatal(err)
	}
	if col.Shards[1].CID != want.Shards[0].CID() {
		t.Errorf("collection shard 1 is %s; manifest shard 0 is %s", col.Shards[1].CID, want.Shards[0].CID())
	}
}

func TestAddModelRefusesBadShard(t *testing.T) {
	dir, m := writeTiny(t, 5)
	path := filepath.Join(dir, m.Shards[0].Filename)
	b, _ := os.ReadFile(path)
	b[len(b)/2] ^= 1
	os.WriteFile(path, b, 0o644)
	st := openStore(t)
	_, _, err := AddModel(context.Background(), st, dir, nil)
	var se *ShardError
	if !errors.As(err, &se) || se.Shard != 0 {
		t.Fatalf("AddModel of a flipped shard: %v; want a *ShardError for shard 0", err)
	}
	os.WriteFile(path, b[:len(b)-1], 0o644)
	if _, _, err = AddModel(context.Background(), st, dir, nil); !errors.As(err, &se) {
		t.Fatalf("AddModel of a short shard: %v; want a *ShardError", err)
	}
}

// A collection whose shards disagree with its manifest is not a model.
func TestLoadManifestChecksShards(t *testing.T) {
	dir, m := writeTiny(t, 5)
	st := openStore(t)
	mb, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
	mi, _ := st.Put(context.Background(), bytesOf(mb))
	other, _ := st.Put(context.Background(), bytesOf(make([]byte, m.Shards[0].Size)))
	col := &cas.Collection{Size: mi.Size + other.Size, Shards: []cas.Shard{{CID: mi.CID, Size: mi.Size}, {CID: other.CID, Size: other.Size}}}
	info, err := st.PutCollection(context.Background(), col)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadManifest(st, info.CID); !errors.Is(err, ErrNotModel) {
		t.Fatalf("LoadManifest: %v; want ErrNotModel", err)
	}
}

func bytesOf(b []byte) *bytes.Reader { return bytes.NewReader(b) }
