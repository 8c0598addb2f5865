package experts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/rdrr/peer/cas"
)

// A model in the store is one collection: its first shard is the manifest
// blob, the others are the model's shards in manifest order. Fetching or
// pinning the collection's CID brings or keeps the whole model; a peer
// that wants only some experts fetches the manifest blob and ranges of the
// shards it names.

// ErrNotModel: a collection whose first shard is not a manifest, or whose
// shards disagree with it.
var ErrNotModel = errors.New("not an RDRR model")

// ShardError is a shard whose bytes do not match the manifest.
type ShardError struct {
	Shard    int
	Filename string
	Reason   string
}

func (e *ShardError) Error() string {
	return fmt.Sprintf("shard %d (%s): %s", e.Shard, e.Filename, e.Reason)
}

// ModelCollection returns the collection of a model whose manifest bytes
// are mb: the manifest blob, then the shards. Its CID names the model.
func ModelCollection(mb []byte, m *Manifest) *cas.Collection {
	col := &cas.Collection{Size: int64(len(mb)) + m.TotalSize, Shards: []cas.Shard{{CID: cas.Sum(mb), Size: int64(len(mb))}}}
	for _, s := range m.Shards {
		col.Shards = append(col.Shards, cas.Shard{CID: s.CID(), Size: s.Size})
	}
	return col
}

// ModelCID returns the CID a model with manifest bytes mb has in a store.
func ModelCID(mb []byte, m *Manifest) cas.CID {
	return cas.CollectionCID(cas.Sum(ModelCollection(mb, m).Marshal()).Digest())
}

// ReadManifestFile reads and validates dir/manifest.json (or a manifest
// file named directly).
func ReadManifestFile(path string) (*Manifest, error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		path = filepath.Join(path, ManifestFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return nil, err
	}
	m, err := Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// AddModel stores the model in dir (manifest.json and its shard files)
// and returns the model's collection. Every shard is checked against its
// size and hash in the manifest; on a mismatch nothing is made of the
// model (the blobs already added are left unpinned, for GC) and the error
// is a *ShardError. progress, if not nil, is told the bytes added.
func AddModel(ctx context.Context, st *cas.Store, dir string, progress Progress) (cas.Info, *Manifest, error) {
	mpath := filepath.Join(dir, ManifestFile)
	m, err := ReadManifestFile(mpath)
	if err != nil {
		return cas.Info{}, nil, err
	}
	mb, err := os.ReadFile(mpath)
	if err != nil {
		return cas.Info{}, nil, err
	}
	mi, err := st.Put(ctx, bytes.NewReader(mb))
	if err != nil {
		return cas.Info{}, nil, err
	}
	col := &cas.Collection{Size: int64(len(mb)) + m.TotalSize, Shards: []cas.Shard{{CID: mi.CID, Size: int64(len(mb))}}}
	var done int64
	for i, s := range m.Shards {
		info, err := addShard(ctx, st, filepath.Join(dir, s.Filename), i, &s)
		if err != nil {
			return cas.Info{}, nil, err
		}
		col.Shards = append(col.Shards, cas.Shard{CID: info.CID, Size: info.Size})
		done += s.Size
		if progress != nil {
			progress(done, m.TotalSize)
		}
	}
	info, err := st.PutCollection(ctx, col)
	return info, m, err
}

func addShard(ctx context.Context, st *cas.Store, path string, i int, s *ShardInfo) (cas.Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return cas.Info{}, &ShardError{i, s.Filename, err.Error()}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return cas.Info{}, err
	}
	if fi.Size() != s.Size {
		return cas.Info{}, &ShardError{i, s.Filename, fmt.Sprintf("file is %d bytes; manifest says %d", fi.Size(), s.Size)}
	}
	info, err := st.Put(ctx, io.LimitReader(f, s.Size))
	if err != nil {
		return cas.Info{}, err
	}
	if info.CID.Digest() != s.Digest() {
		return cas.Info{}, &ShardError{i, s.Filename, fmt.Sprintf("bytes hash to %s; manifest says %s", info.CID, s.CID())}
	}
	return info, nil
}

// LoadManifest reads the manifest of the model c names: a model
// collection (its first shard, checked against the other shards) or a
// raw manifest blob. The bytes are verified by the store as they are read.
func LoadManifest(st *cas.Store, c cas.CID) (*Manifest, error) {
	if !c.IsCollection() {
		return readManifestBlob(st, c)
	}
	col, err := st.Collection(c)
	if err != nil {
		return nil, err
	}
	m, err := readManifestBlob(st, col.Shards[0].CID)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: first shard: %v", c, ErrNotModel, err)
	}
	if len(col.Shards) != 1+len(m.Shards) {
		return nil, fmt.Errorf("%s: %w: %d shards after the manifest; it lists %d", c, ErrNotModel, len(col.Shards)-1, len(m.Shards))
	}
	for i, s := range m.Shards {
		cs := col.Shards[1+i]
		if cs.CID.Digest() != s.Digest() || cs.Size != s.Size {
			return nil, fmt.Errorf("%s: %w: %v", c, ErrNotModel, &ShardError{i, s.Filename, fmt.Sprintf("collection has %s of %d bytes; manifest says %s of %d", cs.CID, cs.Size, s.CID(), s.Size)})
		}
	}
	return m, nil
}

func readManifestBlob(st *cas.Store, c cas.CID) (*Manifest, error) {
	r, err := st.Open(c)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if r.Size() > MaxManifestBytes {
		return nil, fieldErr("(file)", "%d bytes (limit %d)", r.Size(), MaxManifestBytes)
	}
	b := make([]byte, r.Size())
	if _, err := r.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return Decode(b)
}
