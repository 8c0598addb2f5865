package cas

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// ShardSize is the largest blob AddFile makes: a larger file becomes 64 MiB
// shards plus a collection blob that lists them.
const ShardSize = 64 << 20

// collectionMagic opens every collection blob.
const collectionMagic = `{"rdrr":"collection/v1"`

// MaxCollectionShards bounds what ParseCollection accepts.
const MaxCollectionShards = 1 << 20

// MaxCollectionSize bounds a collection blob's bytes (about 700,000 shards,
// some 45 TiB of file).
const MaxCollectionSize = ShardSize

// Collection is a file stored as shards, in order. Its blob is the
// canonical JSON that Marshal writes (FORMAT.md gives it byte by byte):
// {"rdrr":"collection/v1","size":N,"shards":[{"cid":"bafkr4i...","size":N},...]}
// and a collection CID (codec CodecCollection) names it.
type Collection struct {
	Size   int64   `json:"size"`
	Shards []Shard `json:"shards"`
}

// Shard is one piece of a collection: a raw blob.
type Shard struct {
	CID  CID   `json:"cid"`
	Size int64 `json:"size"`
}

type collectionJSON struct {
	Magic  string  `json:"rdrr"`
	Size   int64   `json:"size"`
	Shards []Shard `json:"shards"`
}

// Marshal returns the collection's canonical blob bytes.
func (col *Collection) Marshal() []byte {
	shards := col.Shards
	if shards == nil {
		shards = []Shard{}
	}
	b, _ := json.Marshal(collectionJSON{Magic: "collection/v1", Size: col.Size, Shards: shards})
	return b
}

// IsCollection reports whether b starts like a collection blob. Only a
// collection CID makes a store read bytes as a collection; this is a
// cheap pre-check for tools.
func IsCollection(b []byte) bool { return bytes.HasPrefix(b, []byte(collectionMagic)) }

// ParseCollection parses and checks a collection blob. It accepts only the
// canonical bytes Marshal writes: fields in order, no white space, no
// unknown or repeated keys, canonical raw CIDs; 1 to MaxCollectionShards
// shards, each of 1 to ShardSize bytes, adding up to the total; at most
// MaxCollectionSize bytes in all. Errors wrap ErrNotCollection.
func ParseCollection(b []byte) (*Collection, error) {
	if len(b) > MaxCollectionSize {
		return nil, fmt.Errorf("%w: blob is %d bytes (limit %d)", ErrNotCollection, len(b), MaxCollectionSize)
	}
	if !IsCollection(b) {
		return nil, fmt.Errorf("%w: missing %s header", ErrNotCollection, collectionMagic)
	}
	var cj collectionJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cj); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotCollection, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrNotCollection)
	}
	if n := len(cj.Shards); n == 0 || n > MaxCollectionShards {
		return nil, fmt.Errorf("%w: %d shards (want 1 to %d)", ErrNotCollection, n, MaxCollectionShards)
	}
	var sum int64
	sizes := make(map[CID]int64, len(cj.Shards))
	for i, s := range cj.Shards {
		if s.Size <= 0 || s.Size > ShardSize || s.CID.IsCollection() {
			return nil, fmt.Errorf("%w: shard %d: %s of %d bytes (want a raw CID of 1 to %d bytes)", ErrNotCollection, i, s.CID, s.Size, ShardSize)
		}
		// A blob has one size: a shard listed again (a repeated region)
		// with another is a lie that a reader placing bytes by the list
		// would believe.
		if was, ok := sizes[s.CID]; ok && was != s.Size {
			return nil, fmt.Errorf("%w: shard %d: %s listed as %d bytes and as %d", ErrNotCollection, i, s.CID, was, s.Size)
		}
		sizes[s.CID] = s.Size
		sum += s.Size
	}
	if sum != cj.Size {
		return nil, fmt.Errorf("%w: shards add up to %d bytes; header says %d", ErrNotCollection, sum, cj.Size)
	}
	col := &Collection{Size: cj.Size, Shards: cj.Shards}
	// Canonical form only: this refuses repeated keys (encoding/json keeps
	// the last), keys in another case or order, white space, escapes and
	// other spellings of a number or a CID, so one collection has one CID.
	if !bytes.Equal(col.Marshal(), b) {
		return nil, fmt.Errorf("%w: not in canonical form (see FORMAT.md)", ErrNotCollection)
	}
	return col, nil
}
