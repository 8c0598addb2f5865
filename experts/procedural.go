package experts

import (
	"context"

	"fmt"
	"github.com/rdrr/peer/tiers"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
	"golang.org/x/sync/singleflight"
)

// ProceduralSource serves a synthetic model without storing it: the
// model's collection, its manifest and every shard, each shard
// regenerated from (preset, seed, index) when asked for. A regenerated
// shard is checked against the manifest's hash before a byte is served.
// It implements swarm.Source.
type ProceduralSource struct {
	lo    *Layout
	cid   cas.CID              // the model's collection
	small map[cas.CID]*genBlob // the collection and the manifest
	shard map[cas.CID]int      // shard CIDs to their index

	mu    sync.Mutex
	cache *simplelru.LRU[int, *genBlob] // regenerated shards
	sf    singleflight.Group
}

// genBlob is a blob's bytes and outboard.
type genBlob struct {
	data, ob []byte
}

// ProceduralCacheShards is how many regenerated shards a source keeps
// (each 64 MiB plus 256 KiB of outboard).
const ProceduralCacheShards = 4

// NewProceduralSource serves the synthetic model whose manifest bytes are
// mb (as written by `peer synth --procedural`).
func NewProceduralSource(mb []byte) (*ProceduralSource, error) {
	m, err := Decode(mb)
	if err != nil {
		return nil, err
	}
	if m.Synth == nil {
		return nil, fmt.Errorf("%s is not a synthetic model: its shards cannot be regenerated", m.ModelID)
	}
	p, err := PresetByName(m.Synth.Preset)
	if err != nil {
		return nil, err
	}
	lo, err := NewLayout(p, m.Synth.Seed)
	if err != nil {
		return nil, err
	}
	if err := sameLayout(lo.Manifest, m); err != nil {
		return nil, fmt.Errorf("%s: the manifest is not the layout of preset %s: %w", m.ModelID, p.Name, err)
	}
	lo.Manifest = m
	ps := &ProceduralSource{lo: lo, small: map[cas.CID]*genBlob{}, shard: map[cas.CID]int{}}
	ps.cache, _ = simplelru.NewLRU[int, *genBlob](ProceduralCacheShards, nil)
	ps.addSmall(mb)
	col := ModelCollection(mb, m)
	for i, s := range m.Shards {
		ps.shard[s.CID()] = i
	}
	root := ps.addSmall(col.Marshal())
	ps.cid = cas.CollectionCID(root.Digest())
	ps.small[ps.cid] = ps.small[root]
	return ps, nil
}

// sameLayout checks that m places every tensor where the generator does.
func sameLayout(gen, m *Manifest) error {
	if len(gen.Shards) != len(m.Shards) || len(gen.Tensors) != len(m.Tensors) {
		return fmt.Errorf("%d shards and %d tensors; the generator makes %d and %d", len(m.Shards), len(m.Tensors), len(gen.Shards), len(gen.Tensors))
	}
	for i := range gen.Shards {
		if gen.Shards[i].Size != m.Shards[i].Size {
			return fmt.Errorf("shard %d is %d bytes; the generator makes %d", i, m.Shards[i].Size, gen.Shards[i].Size)
		}
	}
	for name, t := range gen.Tensors {
		u, ok := m.Tensors[name]
		if !ok || u.Shard != t.Shard || u.Offset != t.Offset || u.Size != t.Size || u.DType != t.DType {
			return fmt.Errorf("tensor %q differs", name)
		}
	}
	return nil
}

func (ps *ProceduralSource) addSmall(b []byte) cas.CID {
	var e bao.Encoder
	e.Write(b)
	root, ob := e.Sum(nil)
	c := cas.RawCID(root)
	ps.small[c] = &genBlob{data: b, ob: ob}
	return c
}

// CID returns the model's collection CID.
func (ps *ProceduralSource) CID() cas.CID { return ps.cid }

// Manifest returns the model's manifest.
func (ps *ProceduralSource) Manifest() *Manifest { return ps.lo.Manifest }

// Stat reports the blobs of the model. Safe for concurrent use.
func (ps *ProceduralSource) Stat(c cas.CID) (cas.Info, error) {
	if b, ok := ps.small[c]; ok {
		return cas.Info{CID: c, Size: int64(len(b.data)), Collection: c.IsCollection()}, nil
	}
	if i, ok := ps.shard[c]; ok {
		return cas.Info{CID: c, Size: ps.lo.Manifest.Shards[i].Size}, nil
	}
	return cas.Info{}, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
}

// AppendSlice appends the bao slice of [off, off+n) of c, regenerating
// the shard if it is not cached. Safe for concurrent use.
func (ps *ProceduralSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	b, ok := ps.small[c]
	if !ok {
		i, ok := ps.shard[c]
		if !ok {
			return dst, fmt.Errorf("%s: %w", c, cas.ErrNotFound)
		}
		var err error
		if b, err = ps.regenerate(i); err != nil {
			return dst, err
		}
	}
	size := int64(len(b.data))
	if off < 0 || n <= 0 || off+n > size {
		return dst, fmt.Errorf("blob %s: slice [%d, %d) invalid for a blob of %d bytes", c, off, off+n, size)
	}
	start, end := bao.Cover(size, off, n)
	return bao.AppendSlice(dst, b.ob, b.data[start:end], size, off, n)
}

// regenerate returns shard i's bytes and outboard, from the cache or made
// again (once, however many ask at the same time) and checked against the
// manifest's hash.
func (ps *ProceduralSource) regenerate(i int) (*genBlob, error) {
	ps.mu.Lock()
	b, ok := ps.cache.Get(i)
	ps.mu.Unlock()
	if ok {
		return b, nil
	}
	v, err, _ := ps.sf.Do(fmt.Sprint(i), func() (any, error) {
		s := &ps.lo.Manifest.Shards[i]
		data := make([]byte, s.Size)
		if err := ps.lo.ShardBytes(i, data); err != nil {
			return nil, err
		}
		var e bao.Encoder
		e.Write(data)
		root, ob := e.Sum(nil)
		if cas.Digest(root) != s.Digest() {
			return nil, &ShardError{i, s.Filename, fmt.Sprintf("regenerated bytes hash to %s; the manifest says %s (a different generator version?)", cas.RawCID(root), s.CID())}
		}
		b := &genBlob{data: data, ob: ob}
		ps.mu.Lock()
		ps.cache.Add(i, b)
		ps.mu.Unlock()
		return b, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*genBlob), nil
}

// Has reports whether k's blob is one this source regenerates (a
// tiers.Source, so a peer can page a synthetic model it never stored).
func (ps *ProceduralSource) Has(k tiers.Key) bool {
	_, err := ps.Stat(k.Blob)
	return err == nil
}

// Read fills dst with k's bytes, regenerated and checked against the
// manifest's hash (tiers.Source).
func (ps *ProceduralSource) Read(ctx context.Context, k tiers.Key, dst []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var data []byte
	if b, ok := ps.small[k.Blob]; ok {
		data = b.data
	} else if i, ok := ps.shard[k.Blob]; ok {
		b, err := ps.regenerate(i)
		if err != nil {
			return err
		}
		data = b.data
	} else {
		return fmt.Errorf("%s: %w", k.Blob, cas.ErrNotFound)
	}
	if k.Off < 0 || k.Off+k.Len > int64(len(data)) {
		return fmt.Errorf("%v: outside a %d-byte blob", k, len(data))
	}
	copy(dst, data[k.Off:k.Off+k.Len])
	return nil
}
