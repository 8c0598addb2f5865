package cas

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func readFile(t testing.TB, s *Store, c CID) []byte {
	t.Helper()
	fr, err := s.OpenFile(c)
	if err != nil {
		t.Fatalf("open %s: %v", c, err)
	}
	var out bytes.Buffer
	if _, err := fr.WriteTo(&out); err != nil {
		t.Fatalf("read %s: %v", c, err)
	}
	return out.Bytes()
}

// A user's file whose bytes happen to be a valid collection (the 129-byte
// case of issue 16) is stored and served as itself; only the collection
// CID, which PutCollection returns, reads as the file its shards make.
func TestRawBytesThatParseAsCollectionStayRaw(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	shardData := randData(60, 1000)
	shard := put(t, s, shardData)
	col := &Collection{Size: 1000, Shards: []Shard{{shard.CID, 1000}}}
	user := col.Marshal()
	if len(user) != 129 {
		t.Fatalf("collection blob is %d bytes; want the 129 of the report", len(user))
	}
	path := filepath.Join(t.TempDir(), "user.json")
	if err := os.WriteFile(path, user, 0o644); err != nil {
		t.Fatal(err)
	}
	added, err := s.AddFile(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	putInf := put(t, s, user)
	for _, inf := range []Info{added, putInf} {
		if inf.CID.Codec() != CodecRaw || inf.Collection {
			t.Fatalf("user file stored as %s (collection %v); want raw", inf.CID, inf.Collection)
		}
		if got := readFile(t, s, inf.CID); !bytes.Equal(got, user) {
			t.Fatalf("user file reads back as %d other bytes; want its own %d", len(got), len(user))
		}
		if st, err := s.Stat(inf.CID); err != nil || st.Collection || st.Size != 129 {
			t.Fatalf("Stat: %+v, %v; want a raw blob of 129 bytes", st, err)
		}
		if _, err := s.Collection(inf.CID); !errors.Is(err, ErrNotCollection) {
			t.Fatalf("Collection(raw CID): %v; want ErrNotCollection", err)
		}
		if links, _ := s.Links(inf.CID); len(links) != 0 {
			t.Fatalf("raw user file links %v", links)
		}
	}
	colCID := CollectionCID(added.CID.Digest())
	if _, err := s.Stat(colCID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat of the collection CID of a raw blob: %v; want ErrNotFound", err)
	}
	// Bytes stored as raw that are not a collection stay unreadable as one.
	other := put(t, s, []byte(`{"rdrr":"collection/v1"}`))
	if _, err := s.OpenFile(CollectionCID(other.CID.Digest())); !errors.Is(err, ErrNotCollection) {
		t.Fatalf("OpenFile(collection CID of non-collection bytes): %v; want ErrNotCollection", err)
	}

	// The same bytes as a collection: one stored blob, two readings.
	inf, err := s.PutCollection(ctx, col)
	if err != nil {
		t.Fatal(err)
	}
	if inf.CID != colCID || !inf.Collection || !inf.CID.IsCollection() {
		t.Fatalf("PutCollection returned %s (collection %v); want %s", inf.CID, inf.Collection, colCID)
	}
	if got := readFile(t, s, colCID); !bytes.Equal(got, shardData) {
		t.Fatal("collection CID does not read as the assembled file")
	}
	if got := readFile(t, s, added.CID); !bytes.Equal(got, user) {
		t.Fatal("raw CID of a collection's bytes does not read as those bytes")
	}

	// A rebuilt index knows the bytes as raw only; the collection CID still
	// reads as the file, and links its shards again.
	s.Close()
	os.Remove(filepath.Join(s.Dir(), indexFile))
	s, err = Open(s.Dir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := readFile(t, s, colCID); !bytes.Equal(got, shardData) {
		t.Fatal("after an index rebuild the collection CID does not read as the file")
	}
	if links, _ := s.Links(colCID); len(links) != 1 {
		t.Fatalf("after an index rebuild and a read, links %v", links)
	}
	if got, err := s.Collection(colCID); err != nil || got.Shards[0] != col.Shards[0] {
		t.Fatalf("Collection: %+v, %v", got, err)
	}
	files := 0
	filepath.WalkDir(filepath.Join(s.Dir(), dirBlobs), func(_ string, e os.DirEntry, _ error) error {
		if !e.IsDir() {
			files++
		}
		return nil
	})
	if files != 3 {
		t.Fatalf("%d blob files; want 3 (the shard, the collection bytes once, the other JSON)", files)
	}
}

// AddFile of a file over ShardSize returns a collection CID; its raw CID
// reads as the collection's JSON.
func TestAddFileReturnsCollectionCID(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB")
	}
	s := newStore(t)
	data := randData(61, ShardSize+10)
	path := filepath.Join(t.TempDir(), "big")
	os.WriteFile(path, data, 0o644)
	inf, err := s.AddFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !inf.CID.IsCollection() || !inf.Collection {
		t.Fatalf("AddFile of %d bytes returned %s; want a collection CID", len(data), inf.CID)
	}
	raw := readFile(t, s, inf.CID.Raw())
	if _, err := ParseCollection(raw); err != nil {
		t.Fatalf("raw CID of the collection: %v", err)
	}
}

// A collection CID fetched through a Partial is linked on completion; the
// raw CID of the same bytes is not; a collection CID whose bytes are not a
// collection is refused.
func TestPartialCodecs(t *testing.T) {
	ctx := context.Background()
	src := newStore(t)
	sh := put(t, src, randData(62, 1000))
	col, err := src.PutCollection(ctx, &Collection{Size: 1000, Shards: []Shard{{sh.CID, 1000}}})
	if err != nil {
		t.Fatal(err)
	}
	fetch := func(dst *Store, c CID, size int64) (Info, error) {
		t.Helper()
		p, err := dst.OpenPartial(c, size)
		if err != nil {
			return Info{}, err
		}
		slice, err := src.AppendSlice(nil, c.Raw(), 0, size)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WriteSlice(0, size, slice); err != nil {
			t.Fatal(err)
		}
		return p.Finish(ctx)
	}

	dst := newStore(t)
	inf, err := fetch(dst, col.CID.Raw(), col.Size)
	if err != nil || inf.Collection {
		t.Fatalf("raw fetch: %+v, %v; want a raw blob", inf, err)
	}
	if links, _ := dst.Links(col.CID); len(links) != 0 {
		t.Fatalf("raw fetch linked %v", links)
	}
	// Opening the collection CID of bytes already stored holds them as a
	// collection at once.
	p, err := dst.OpenPartial(col.CID, col.Size)
	if err != nil || !p.Complete() {
		t.Fatalf("OpenPartial(collection CID of stored bytes): complete %v, %v", p != nil && p.Complete(), err)
	}
	inf, err = p.Finish(ctx)
	if err != nil || !inf.Collection || inf.CID != col.CID {
		t.Fatalf("Finish: %+v, %v; want the collection", inf, err)
	}
	if links, _ := dst.Links(col.CID); !slices.Equal(links, []CID{sh.CID}) {
		t.Fatalf("links %v; want [%s]", links, sh.CID)
	}

	// Bytes that are not a collection, asked for by a collection CID.
	notCol := put(t, src, []byte(`{"rdrr":"collection/v1","size":1}`))
	dst2 := newStore(t)
	if _, err := fetch(dst2, CollectionCID(notCol.CID.Digest()), notCol.Size); !errors.Is(err, ErrNotCollection) {
		t.Fatalf("Finish of a collection CID whose bytes are no collection: %v; want ErrNotCollection", err)
	}
	if dst2.Has(notCol.CID) {
		t.Fatal("bytes refused as a collection were stored")
	}
	if parts, _ := dst2.Partials(); len(parts) != 0 {
		t.Fatalf("refused download left %v", parts)
	}
}

// Pinning a collection CID keeps its shards; pinning the raw CID of the
// same bytes keeps only the blob.
func TestCollectionAndRawPins(t *testing.T) {
	ctx := context.Background()
	for _, pinCollection := range []bool{true, false} {
		s := newStore(t)
		sh1, sh2 := put(t, s, randData(63, 4000)), put(t, s, randData(64, 5000))
		col, err := s.PutCollection(ctx, &Collection{Size: 9000, Shards: []Shard{{sh1.CID, 4000}, {sh2.CID, 5000}}})
		if err != nil {
			t.Fatal(err)
		}
		pinned := col.CID
		if !pinCollection {
			pinned = col.CID.Raw()
		}
		if err := s.Pin(pinned, PinUser); err != nil {
			t.Fatal(err)
		}
		if inf, _ := s.Stat(pinned); len(inf.Pins) != 1 {
			t.Fatalf("Stat(%s).Pins = %v; want one", pinned, inf.Pins)
		}
		other := col.CID.Raw()
		if !pinCollection {
			other = col.CID
		}
		if inf, _ := s.Stat(other); len(inf.Pins) != 0 {
			t.Fatalf("pin of %s shows on %s", pinned, other)
		}
		if _, err := s.GC(ctx, -1); err != nil {
			t.Fatal(err)
		}
		if !s.Has(col.CID.Raw()) {
			t.Fatalf("pinned %s: its blob was collected", pinned)
		}
		if got := s.Has(sh1.CID) && s.Has(sh2.CID); got != pinCollection {
			t.Fatalf("pinned %s: shards kept %v; want %v", pinned, got, pinCollection)
		}
		if got := s.Has(col.CID); got != pinCollection {
			t.Fatalf("pinned %s: collection CID still stored %v; want %v", pinned, got, pinCollection)
		}
		if !pinCollection {
			if got := readFile(t, s, col.CID.Raw()); !bytes.Equal(got, (&Collection{Size: 9000, Shards: []Shard{{sh1.CID, 4000}, {sh2.CID, 5000}}}).Marshal()) {
				t.Fatal("raw-pinned blob changed")
			}
		}
	}
}

// An index of version 1 (one pin per digest) opens as version 2 with each
// pin on the CID the blob was known by.
func TestIndexV1PinsMigrate(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	sh := put(t, s, randData(65, 100))
	col, _ := s.PutCollection(ctx, &Collection{Size: 100, Shards: []Shard{{sh.CID, 100}}})
	s.Pin(col.CID, PinUser)
	s.Pin(sh.CID, PinKernel)
	s.Close()
	db, err := bolt.Open(filepath.Join(dir, indexFile), 0o644, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPins)
		var keys [][]byte
		b.ForEach(func(k, _ []byte) error { keys = append(keys, append([]byte(nil), k...)); return nil })
		for _, k := range keys {
			v := append([]byte(nil), b.Get(k)...)
			b.Delete(k)
			b.Put(append(k[:32:32], k[33:]...), v) // version 1: digest + reason
		}
		return tx.Bucket(bucketMeta).Put([]byte("version"), binary.LittleEndian.AppendUint64(nil, 1))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for c, reason := range map[CID]string{col.CID: PinUser, sh.CID: PinKernel} {
		inf, err := s.Stat(c)
		if err != nil || len(inf.Pins) != 1 || inf.Pins[0].Reason != reason {
			t.Fatalf("after migration %s has pins %+v (%v); want %q", c, inf.Pins, err, reason)
		}
	}
	if inf, _ := s.Stat(col.CID.Raw()); len(inf.Pins) != 0 {
		t.Fatalf("collection's pin migrated to its raw CID too: %v", inf.Pins)
	}
}

// ParseCollection accepts the canonical bytes only (FORMAT.md §3): every
// other spelling of the same collection, and anything else, is refused.
func TestParseCollectionStrict(t *testing.T) {
	sh := Sum([]byte("shard"))
	good := (&Collection{Size: 5, Shards: []Shard{{sh, 5}}}).Marshal()
	if _, err := ParseCollection(good); err != nil {
		t.Fatalf("canonical collection refused: %v", err)
	}
	cid := `"` + sh.String() + `"`
	// A repeated region: one CID twice with one size.
	if _, err := ParseCollection((&Collection{Size: 10, Shards: []Shard{{sh, 5}, {sh, 5}}}).Marshal()); err != nil {
		t.Fatalf("a shard listed twice refused: %v", err)
	}
	for name, b := range map[string]string{
		"repeated key":         `{"rdrr":"collection/v1","size":5,"size":5,"shards":[{"cid":` + cid + `,"size":5}]}`,
		"repeated shard key":   `{"rdrr":"collection/v1","size":5,"shards":[{"cid":` + cid + `,"size":4,"size":5}]}`,
		"unknown key":          `{"rdrr":"collection/v1","size":5,"shards":[{"cid":` + cid + `,"size":5}],"x":1}`,
		"unknown shard key":    `{"rdrr":"collection/v1","size":5,"shards":[{"cid":` + cid + `,"size":5,"x":1}]}`,
		"keys reordered":       `{"rdrr":"collection/v1","shards":[{"cid":` + cid + `,"size":5}],"size":5}`,
		"shard keys reordered": `{"rdrr":"collection/v1","size":5,"shards":[{"size":5,"cid":` + cid + `}]}`,
		"key case":             `{"rdrr":"collection/v1","Size":5,"shards":[{"cid":` + cid + `,"size":5}]}`,
		"white space":          `{"rdrr":"collection/v1","size":5,"shards":[ {"cid":` + cid + `,"size":5}]}`,
		"trailing newline":     string(good) + "\n",
		"number spelling":      `{"rdrr":"collection/v1","size":5.0,"shards":[{"cid":` + cid + `,"size":5}]}`,
		"hex CID":              `{"rdrr":"collection/v1","size":5,"shards":[{"cid":"` + sh.Hex() + `","size":5}]}`,
		"upper-case CID":       `{"rdrr":"collection/v1","size":5,"shards":[{"cid":"B` + strings.ToUpper(sh.String()[1:]) + `","size":5}]}`,
		"collection shard":     `{"rdrr":"collection/v1","size":5,"shards":[{"cid":"` + CollectionCID(sh.Digest()).String() + `","size":5}]}`,
		"no shards":            `{"rdrr":"collection/v1","size":0,"shards":[]}`,
		"null shards":          `{"rdrr":"collection/v1","size":0,"shards":null}`,
		"sizes disagree":       `{"rdrr":"collection/v1","size":6,"shards":[{"cid":` + cid + `,"size":5}]}`,
		"escaped key":          `{"rdrr":"collection/v1","siz\u0065":5,"shards":[{"cid":` + cid + `,"size":5}]}`,
		"one CID, two sizes":   `{"rdrr":"collection/v1","size":9,"shards":[{"cid":` + cid + `,"size":5},{"cid":` + cid + `,"size":4}]}`,
	} {
		if _, err := ParseCollection([]byte(b)); !errors.Is(err, ErrNotCollection) {
			t.Errorf("%s: ParseCollection(%s) = %v; want ErrNotCollection", name, b, err)
		}
	}
}
