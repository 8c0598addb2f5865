package cas

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	zeebo "github.com/zeebo/blake3"
)

func newStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func randData(seed uint64, n int64) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t testing.TB, s *Store, b []byte) Info {
	t.Helper()
	inf, err := s.Put(context.Background(), bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return inf
}

// The official BLAKE3 test vectors, through the store: the CID of each
// input is its BLAKE3-256 hash.
func TestBLAKE3VectorsThroughStore(t *testing.T) {
	raw, err := os.ReadFile("testdata/blake3-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vec struct {
		Cases []struct {
			InputLen int    `json:"input_len"`
			Hash     string `json:"hash"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	if len(vec.Cases) < 20 {
		t.Fatalf("only %d vectors", len(vec.Cases))
	}
	s := newStore(t)
	for _, tc := range vec.Cases {
		in := make([]byte, tc.InputLen)
		for i := range in {
			in[i] = byte(i % 251)
		}
		inf := put(t, s, in)
		if got, want := inf.CID.Hex(), tc.Hash[:64]; got != want {
			t.Errorf("input_len %d: CID %s; want %s", tc.InputLen, got, want)
		}
		back := make([]byte, len(in))
		if _, err := s.ReadAt(inf.CID, back, 0); err != nil && err != io.EOF {
			t.Fatalf("input_len %d: read back: %v", tc.InputLen, err)
		}
		if !bytes.Equal(back, in) {
			t.Errorf("input_len %d: read back differs", tc.InputLen)
		}
	}
}

func TestRoundTripSizes(t *testing.T) {
	sizes := []int64{0, 1, GroupSize - 1, GroupSize, GroupSize + 1, ShardSize - 1, ShardSize, ShardSize + 1, 200 << 20}
	s := newStore(t)
	dir := t.TempDir()
	for i, size := range sizes {
		if testing.Short() && size > ShardSize+1 {
			continue
		}
		data := randData(uint64(i), size)
		path := filepath.Join(dir, "in")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		inf, err := s.AddFile(context.Background(), path, nil)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if size > ShardSize != inf.Collection {
			t.Errorf("size %d: collection %v", size, inf.Collection)
		}
		if !inf.Collection && inf.CID != RawCID(zeebo.Sum256(data)) {
			t.Errorf("size %d: CID is not the BLAKE3 of the data", size)
		}
		fr, err := s.OpenFile(inf.CID)
		if err != nil {
			t.Fatal(err)
		}
		if fr.Size() != size {
			t.Fatalf("size %d: file size %d", size, fr.Size())
		}
		var out bytes.Buffer
		if _, err := fr.WriteTo(&out); err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("size %d: round trip differs", size)
		}
		if size > 0 {
			// A read across a shard boundary.
			off := max(0, min(size-1, ShardSize-100))
			n := min(size-off, 300)
			p := make([]byte, n)
			if _, err := fr.ReadAt(p, off); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if !bytes.Equal(p, data[off:off+n]) {
				t.Fatalf("size %d: ReadAt(%d, %d) differs", size, off, n)
			}
		}
	}
}

func TestCIDParse(t *testing.T) {
	c := Sum([]byte("hello"))
	s := c.String()
	if s[:7] != "bafkr4i" {
		t.Fatalf("CID %s does not start with bafkr4i", s)
	}
	for _, in := range []string{s, c.Hex(), "B" + string(bytes.ToUpper([]byte(s[1:])))} {
		got, err := ParseCID(in)
		if err != nil || got != c {
			t.Errorf("ParseCID(%q) = %v, %v; want %v", in, got, err, c)
		}
	}
	for _, bad := range []string{"", "b", "bafkqaaa", s[:len(s)-1], s + "a", "zQm", c.Hex()[:63], c.Hex() + "0", "g" + c.Hex()[1:],
		// a raw CID with a sha2-256 multihash
		"bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"} {
		if _, err := ParseCID(bad); !errors.Is(err, ErrBadCID) {
			t.Errorf("ParseCID(%q) err %v; want ErrBadCID", bad, err)
		}
	}
	// Collection CIDs: their own prefix, both cases, canonical only.
	cc := CollectionCID(c.Digest())
	if cs := cc.String(); !strings.HasPrefix(cs, "bagaybqabdyq") || len(cs) != 64 {
		t.Fatalf("collection CID %s: want bagaybqabdyq... of 64 characters", cs)
	}
	for _, in := range []string{cc.String(), "B" + string(bytes.ToUpper([]byte(cc.String()[1:])))} {
		if got, err := ParseCID(in); err != nil || got != cc || !got.IsCollection() {
			t.Errorf("ParseCID(%q) = %v, %v; want %v", in, got, err, cc)
		}
	}
	ccs := cc.String()
	for _, bad := range []string{ccs[:len(ccs)-1], ccs + "a", ccs[:len(ccs)-1] + "b" /* trailing bits */, "bagaybqabdyq" + s[12:]} {
		if _, err := ParseCID(bad); !errors.Is(err, ErrBadCID) {
			t.Errorf("ParseCID(%q) err %v; want ErrBadCID", bad, err)
		}
	}
	var j struct{ C CID }
	if err := json.Unmarshal([]byte(`{"C":"`+c.Hex()+`"}`), &j); err != nil || j.C != c {
		t.Errorf("JSON hex spelling: %v %v", j.C, err)
	}
}

func TestPutDeduplicatesAndStat(t *testing.T) {
	s := newStore(t)
	data := randData(7, 100_000)
	a, b := put(t, s, data), put(t, s, data)
	if a.CID != b.CID {
		t.Fatal("same bytes, different CIDs")
	}
	inf, err := s.Stat(a.CID)
	if err != nil || inf.Size != int64(len(data)) {
		t.Fatalf("Stat: %+v %v", inf, err)
	}
	if _, err := s.Stat(Sum([]byte("absent"))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat absent: %v; want ErrNotFound", err)
	}
	n := 0
	s.List(func(Info) error { n++; return nil })
	if n != 1 {
		t.Fatalf("List: %d blobs; want 1", n)
	}
}

// A flipped byte in one 16 KiB group of a stored blob is caught by any
// read that covers it, and the error names that group; other groups still
// read.
func TestFlippedByteOnDiskIsCaught(t *testing.T) {
	s := newStore(t)
	data := randData(8, 10*GroupSize+77)
	c := put(t, s, data).CID
	s.obCache.Purge()
	const g = 6
	path := s.blobPath(c)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{data[g*GroupSize+123] ^ 0x10}, g*GroupSize+123)
	f.Close()

	p := make([]byte, len(data))
	_, err = s.ReadAt(c, p, 0)
	var re *RangeError
	if !errors.As(err, &re) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of flipped blob: %v; want *RangeError wrapping ErrCorrupt", err)
	}
	if re.CID != c || re.Off != g*GroupSize || re.Len != GroupSize {
		t.Fatalf("error names %s [%d,+%d); want %s [%d,+%d)", re.CID, re.Off, re.Len, c, g*GroupSize, GroupSize)
	}
	if _, err := s.AppendSlice(nil, c, g*GroupSize+5, 10); !errors.As(err, &re) {
		t.Fatalf("slice of flipped group served: %v", err)
	}
	// Groups before and after are fine.
	if _, err := s.ReadAt(c, p[:GroupSize], 0); err != nil {
		t.Fatalf("unrelated group: %v", err)
	}
	if _, err := s.ReadAt(c, p[:100], (g+1)*GroupSize); err != nil {
		t.Fatalf("unrelated group: %v", err)
	}
}

func TestTruncatedBlobIsCaughtAndScrubbed(t *testing.T) {
	s := newStore(t)
	good := put(t, s, randData(9, 3*GroupSize)).CID
	bad := put(t, s, randData(10, 5*GroupSize+9)).CID
	flipped := put(t, s, randData(11, 2*GroupSize)).CID
	obBad := put(t, s, randData(12, 4*GroupSize)).CID
	if err := os.Truncate(s.blobPath(bad), 2*GroupSize); err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(s.blobPath(flipped), os.O_RDWR, 0)
	f.WriteAt([]byte{0}, GroupSize+1)
	f.WriteAt([]byte{1}, GroupSize+2)
	f.Close()
	ob, _ := os.ReadFile(s.outboardPath(obBad))
	ob[20] ^= 1
	os.WriteFile(s.outboardPath(obBad), ob, 0o644)
	s.obCache.Purge()

	if _, err := s.ReadAt(bad, make([]byte, 5*GroupSize), 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated blob read: %v; want ErrCorrupt", err)
	}
	rep, err := s.Scrub(context.Background(), ScrubOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Blobs != 4 {
		t.Errorf("scrub checked %d blobs; want 4", rep.Blobs)
	}
	badSet := map[CID]bool{}
	for _, b := range rep.Bad {
		badSet[b.CID] = true
	}
	if len(rep.Bad) != 2 || !badSet[bad] || !badSet[flipped] {
		t.Fatalf("scrub reported %+v; want exactly %s and %s", rep.Bad, bad, flipped)
	}
	if len(rep.Repaired) != 1 || rep.Repaired[0] != obBad {
		t.Fatalf("scrub repaired %v; want the damaged outboard of %s", rep.Repaired, obBad)
	}
	// Corrupt blobs are never served again, even the bytes that verify.
	if _, err := s.AppendSlice(nil, flipped, 0, 10); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("corrupt blob served: %v", err)
	}
	if s.Has(flipped) || !s.Has(good) {
		t.Fatal("Has does not reflect scrub")
	}
	if _, err := s.ReadAt(obBad, make([]byte, 10), 0); err != nil {
		t.Fatalf("blob with repaired outboard: %v", err)
	}
	// Re-adding the right bytes heals the blob.
	put(t, s, randData(11, 2*GroupSize))
	if !s.Has(flipped) {
		t.Fatal("re-adding a corrupt blob did not replace it")
	}
}

func TestLockedAndCorruptIndex(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(dir, Options{LockTimeout: 100e6})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second open: %v; want ErrLocked", err)
	}
	c := put(t, s, []byte("keep me")).CID
	s.Close()

	idx := filepath.Join(dir, indexFile)
	b, _ := os.ReadFile(idx)
	for i := range b {
		b[i] = 0xA5
	}
	os.WriteFile(idx, b, 0o644)
	_, err = Open(dir, Options{})
	if err == nil {
		t.Fatal("corrupt index opened without error")
	}
	t.Logf("corrupt index: %v", err)
	// The blob data is untouched, and moving the index aside rebuilds it.
	if _, err := os.Stat(filepath.Join(dir, dirBlobs, c.Hex()[:2], c.Hex())); err != nil {
		t.Fatalf("blob file lost: %v", err)
	}
	os.Rename(idx, idx+".bad")
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := make([]byte, 7)
	if _, err := s.ReadAt(c, got, 0); err != nil || string(got) != "keep me" {
		t.Fatalf("after rebuild: %q %v", got, err)
	}
}

func TestPinsLinksAndGC(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	var now int64 = 1e18
	s.opt.Now = func() time.Time { now += 1e9; return time.Unix(0, now) }
	a := put(t, s, randData(20, 1000)).CID // oldest
	b := put(t, s, randData(21, 2000)).CID
	c := put(t, s, randData(22, 3000)).CID
	sh1 := put(t, s, randData(23, 4000))
	sh2 := put(t, s, randData(24, 5000))
	col, err := s.PutCollection(ctx, &Collection{Size: 9000, Shards: []Shard{{sh1.CID, 4000}, {sh2.CID, 5000}}})
	if err != nil {
		t.Fatal(err)
	}
	if !col.Collection {
		t.Fatal("collection not flagged")
	}
	if err := s.Pin(b, PinUser); err != nil {
		t.Fatal(err)
	}
	if err := s.Pin(Sum([]byte("nope")), PinUser); !errors.Is(err, ErrNotFound) {
		t.Fatalf("pin of absent blob: %v", err)
	}
	s.ReadAt(a, make([]byte, 10), 0) // a becomes most recently used

	// Budget: remove least recently used unpinned, unlinked blobs only.
	total := int64(1000 + 2000 + 3000 + 4000 + 5000 + col.Size)
	rep, err := s.GC(ctx, total-1)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 1 || rep.Removed[0] != c {
		t.Fatalf("GC removed %v; want the LRU unpinned blob %s", rep.Removed, c)
	}
	// Everything collectable: a and the collection, then its shards.
	rep, err = s.GC(ctx, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Removed) != 4 {
		t.Fatalf("GC(-1) removed %d blobs; want 4 (a, collection, 2 shards)", len(rep.Removed))
	}
	if !s.Has(b) || s.Has(a) || s.Has(sh1.CID) {
		t.Fatal("wrong blobs survived GC")
	}
	if ok, _ := s.Unpin(b, PinUser); !ok {
		t.Fatal("unpin found no pin")
	}
	s.GC(ctx, -1)
	if s.Has(b) {
		t.Fatal("unpinned blob survived GC(-1)")
	}
}
