package browser

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
)

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// blobOf returns the CID and outboard of data.
func blobOf(data []byte) (cas.CID, []byte) {
	var enc bao.Encoder
	enc.Write(data)
	root, ob := enc.Sum(nil)
	return cas.RawCID(cas.Digest(root)), ob
}

// sliceOf returns the bao slice of [off, off+n) of data, as a peer sends it.
func sliceOf(t testing.TB, data, ob []byte, off, n int64) []byte {
	t.Helper()
	start, end := bao.Cover(int64(len(data)), off, n)
	s, err := bao.AppendSlice(nil, ob, data[start:end], int64(len(data)), off, n)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func openStore(t testing.TB, f Files, opt Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), f, opt)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestPutReadHash(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{0, 1, groupSize, pieceSize + 5, 3*pieceSize + 3*groupSize + 7} {
		data := randBytes(uint64(size), size)
		s := openStore(t, NewMemFiles(), Options{})
		c, err := s.Put(ctx, data)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := blobOf(data)
		if c != want {
			t.Fatalf("size %d: Put = %s; want %s", size, c, want)
		}
		got, err := s.Read(ctx, c, 0, int64(size))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("size %d: Read: %v, equal %v", size, err, bytes.Equal(got, data))
		}
		h, err := s.Hash(ctx, c)
		if err != nil || cas.RawCID(cas.Digest(h)) != c {
			t.Fatalf("size %d: Hash = %x, %v; want %s", size, h, err, c)
		}
	}
}

// A download written in pieces, out of order, some of them not whole
// groups of a piece, reads back byte-exact, and its outboard serves
// slices that verify.
func TestDownload(t *testing.T) {
	ctx := context.Background()
	size := int64(5*pieceSize + 3*groupSize + 100)
	data := randBytes(1, int(size))
	c, ob := blobOf(data)
	s := openStore(t, NewMemFiles(), Options{})
	p, err := s.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	ranges := [][2]int64{{2 * pieceSize, pieceSize}, {5 * pieceSize, size - 5*pieceSize}, {groupSize, 2 * groupSize}, {0, groupSize}, {3 * groupSize, pieceSize - 3*groupSize}, {pieceSize, pieceSize}, {3 * pieceSize, 2 * pieceSize}}
	for i, r := range ranges {
		if err := p.WriteSlice(r[0], r[1], sliceOf(t, data, ob, r[0], r[1])); err != nil {
			t.Fatalf("write %d %v: %v", i, r, err)
		}
		if i == 2 {
			// Served while downloading: the groups verified so far.
			if _, err := s.AppendPartialSlice(nil, c, groupSize, groupSize); err != nil {
				t.Fatalf("partial slice: %v", err)
			}
			if _, err := s.AppendPartialSlice(nil, c, pieceSize, groupSize); !errors.Is(err, cas.ErrNotFound) {
				t.Fatalf("partial slice of a missing group: %v; want ErrNotFound", err)
			}
		}
	}
	if m := p.Missing(); len(m) != 0 {
		t.Fatalf("missing %v after every range", m)
	}
	if _, err := p.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Read(ctx, c, 0, size)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, data))
	}
	sl, err := s.AppendSlice(nil, c, 4*pieceSize, pieceSize)
	if err != nil {
		t.Fatal(err)
	}
	if want := sliceOf(t, data, ob, 4*pieceSize, pieceSize); !bytes.Equal(sl, want) {
		t.Fatal("served slice differs from the reference encoding")
	}
}

// A slice with one flipped byte is refused with a RangeError naming its
// group, and nothing of it is kept: no piece file, no bit.
func TestBadSliceKeepsNothing(t *testing.T) {
	size := int64(2 * pieceSize)
	data := randBytes(2, int(size))
	c, ob := blobOf(data)
	f := NewMemFiles()
	s := openStore(t, f, Options{})
	p, err := s.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	sl := sliceOf(t, data, ob, pieceSize, pieceSize)
	sl[len(sl)-100] ^= 0x40 // in the last group
	err = p.WriteSlice(pieceSize, pieceSize, sl)
	var re *cas.RangeError
	if !errors.As(err, &re) || re.Off != size-groupSize || re.Len != groupSize {
		t.Fatalf("bad slice: %v; want a RangeError for [%d, +%d)", err, size-groupSize, groupSize)
	}
	names, _ := f.List(context.Background())
	for _, n := range names {
		if strings.Contains(n, ".p") {
			t.Fatalf("file %s kept after a bad slice", n)
		}
	}
	if m := p.Missing(); len(m) != 1 || m[0] != (cas.Range{Off: 0, Len: size}) {
		t.Fatalf("missing %v after a bad slice; want everything", m)
	}
	p.Close()
}

// A download closed halfway resumes in a new Store over the same files
// (a reloaded page) from the groups it kept.
func TestResume(t *testing.T) {
	ctx := context.Background()
	size := int64(4*pieceSize + 77)
	data := randBytes(3, int(size))
	c, ob := blobOf(data)
	f := NewMemFiles()
	s := openStore(t, f, Options{})
	p, _ := s.OpenPartial(c, size)
	for _, off := range []int64{0, 2 * pieceSize} {
		if err := p.WriteSlice(off, pieceSize, sliceOf(t, data, ob, off, pieceSize)); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()

	s2 := openStore(t, f, Options{})
	parts, _ := s2.Partials()
	if parts[c] != size {
		t.Fatalf("Partials after reopen = %v; want %s: %d", parts, c, size)
	}
	p2, err := s2.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	want := []cas.Range{{Off: pieceSize, Len: pieceSize}, {Off: 3 * pieceSize, Len: size - 3*pieceSize}}
	if m := p2.Missing(); len(m) != 2 || m[0] != want[0] || m[1] != want[1] {
		t.Fatalf("missing after resume = %v; want %v", m, want)
	}
	for _, r := range want {
		if err := p2.WriteSlice(r.Off, r.Len, sliceOf(t, data, ob, r.Off, r.Len)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p2.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	s3 := openStore(t, f, Options{})
	if got, err := s3.Read(ctx, c, 0, size); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after a second reopen: %v", err)
	}
}

// Storage changed under the store is caught when read, never served, and
// the blob is dropped.
func TestCorruptStorage(t *testing.T) {
	ctx := context.Background()
	data := randBytes(4, 2*pieceSize)
	f := NewMemFiles()
	s := openStore(t, f, Options{})
	c, err := s.Put(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Corrupt(pieceName(c, 1), 5) {
		t.Fatal("no piece to corrupt")
	}
	if _, err := s.AppendSlice(nil, c, 0, pieceSize); err != nil {
		t.Fatalf("piece 0 is intact: %v", err)
	}
	if _, err := s.AppendSlice(nil, c, pieceSize, pieceSize); !errors.Is(err, cas.ErrCorrupt) {
		t.Fatalf("corrupt piece served: %v", err)
	}
	if _, err := s.Stat(c); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("corrupt blob still held: %v", err)
	}
	// A record that claims more than it has is dropped at open.
	c2, _ := s.Put(ctx, data[:pieceSize])
	f.Corrupt(c2.Hex()+".o", 100)
	s2 := openStore(t, f, Options{})
	if _, err := s2.Stat(c2); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("blob with a changed outboard kept at open: %v", err)
	}
	// A record that claims more than the budget is dropped, files and all.
	c3, _ := s2.Put(ctx, data[:groupSize])
	f.Write(ctx, c3.Hex()+".m", encodeRecord(1<<40, true, nil))
	s3 := openStore(t, f, Options{Budget: 1 << 30})
	if _, err := s3.Stat(c3); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("record claiming 1 TiB kept at open: %v", err)
	}
	if names, _ := f.List(ctx); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, c3.Hex()) }) {
		t.Errorf("files of a dropped record kept: %v", names)
	}
}

// The budget evicts the least recently used whole blobs, never a download
// in progress (open or not), and refuses what cannot fit.
func TestBudget(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, NewMemFiles(), Options{Budget: 3 * pieceSize})
	a, _ := s.Put(ctx, randBytes(10, pieceSize))
	b, _ := s.Put(ctx, randBytes(11, pieceSize))
	if _, err := s.AppendSlice(nil, a, 0, groupSize); err != nil { // a is now newer than b
		t.Fatal(err)
	}
	dl, _ := blobOf(randBytes(12, pieceSize))
	p, err := s.OpenPartial(dl, pieceSize)
	if err != nil {
		t.Fatal(err)
	}
	p.Close() // closed, the download still keeps its room
	c, err := s.Put(ctx, randBytes(13, pieceSize))
	if err != nil {
		t.Fatal(err)
	}
	if parts, _ := s.Partials(); parts[dl] != pieceSize {
		t.Errorf("download evicted: partials %v", parts)
	}
	for _, x := range []struct {
		c    cas.CID
		held bool
	}{{a, true}, {b, false}, {c, true}} {
		if _, err := s.Stat(x.c); (err == nil) != x.held {
			t.Errorf("%s held = %v; want %v", x.c, err == nil, x.held)
		}
	}
	if _, err := s.Put(ctx, randBytes(14, 4*pieceSize)); !errors.Is(err, ErrFull) {
		t.Fatalf("blob over the budget: %v; want ErrFull", err)
	}
	if used, _ := s.Used(); used != 3*pieceSize {
		t.Fatalf("used %d; want %d", used, 3*pieceSize)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(5*groupSize, false, []uint64{3}))
	f.Add(encodeRecord(100, true, nil))
	f.Fuzz(func(t *testing.T, v []byte) {
		size, complete, have, err := decodeRecord(v)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeRecord(size, complete, have), v) {
			t.Fatalf("record %x decodes but does not encode back", v)
		}
	})
}
