package cas

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Random verified ranges from one store rebuild the blob in another, in
// random order and from several goroutines.
func TestVerifiedRangeRoundTrip(t *testing.T) {
	ctx := context.Background()
	src, dst := newStore(t), newStore(t)
	for i, size := range []int64{1, GroupSize, 3*GroupSize + 1, 100*GroupSize + 5, 4<<20 + 3} {
		data := randData(uint64(30+i), size)
		c := put(t, src, data).CID
		p, err := dst.OpenPartial(c, size)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(uint64(i), 1))
		// Random ranges first (overlapping, unaligned), then whatever is
		// missing, written concurrently.
		for range 20 {
			off := r.Int64N(size)
			n := 1 + r.Int64N(min(size-off, 1<<20))
			slice, err := src.AppendSlice(nil, c, off, n)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(slice)) != SliceLen(size, off, n) {
				t.Fatalf("slice length %d; SliceLen %d", len(slice), SliceLen(size, off, n))
			}
			if err := p.WriteSlice(off, n, slice); err != nil {
				t.Fatalf("size %d [%d,+%d): %v", size, off, n, err)
			}
			if !p.Have(off, n) {
				t.Fatalf("Have false after WriteSlice")
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for _, m := range p.Missing() {
			for off := m.Off; off < m.Off+m.Len; off += 256 << 10 {
				n := min(256<<10, m.Off+m.Len-off)
				wg.Add(1)
				go func() {
					defer wg.Done()
					slice, err := src.AppendSlice(nil, c, off, n)
					if err == nil {
						err = p.WriteSlice(off, n, slice)
					}
					if err != nil {
						errs <- err
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if !p.Complete() {
			t.Fatalf("size %d: not complete; missing %v", size, p.Missing())
		}
		inf, err := p.Finish(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if inf.CID != c || inf.Size != size {
			t.Fatalf("finished %+v", inf)
		}
		got := make([]byte, size)
		if _, err := dst.ReadAt(c, got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("size %d: fetched blob differs", size)
		}
	}
}

// A slice with one flipped byte is rejected, naming the group, and nothing
// of it is written; the right slice is then accepted.
func TestBadSliceWritesNothing(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	size := int64(8 * GroupSize)
	data := randData(40, size)
	c := put(t, src, data).CID
	p, err := dst.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	off, n := int64(2*GroupSize), int64(4*GroupSize)
	slice, _ := src.AppendSlice(nil, c, off, n)
	// Find the data of group 4 in the slice and flip a byte there.
	g4 := bytes.Index(slice, data[4*GroupSize:4*GroupSize+64])
	bad := bytes.Clone(slice)
	bad[g4+1000] ^= 0xff
	err = p.WriteSlice(off, n, bad)
	var re *RangeError
	if !errors.As(err, &re) || re.CID != c || re.Off != 4*GroupSize || re.Len != GroupSize {
		t.Fatalf("bad slice: %v; want RangeError at group 4", err)
	}
	if p.Have(off, GroupSize) || len(p.Missing()) != 1 || p.Missing()[0].Len != size {
		t.Fatalf("bad slice marked groups present: missing %v", p.Missing())
	}
	st, _ := os.Stat(dst.partialPath(c, ".data"))
	if st.Size() != 0 {
		t.Fatalf("bad slice wrote %d bytes", st.Size())
	}
	if err := p.WriteSlice(off, n, slice); err != nil {
		t.Fatal(err)
	}
	// A slice for the wrong range or blob is rejected too.
	if err := p.WriteSlice(0, GroupSize, slice); err == nil {
		t.Fatal("slice accepted for the wrong range")
	}
}

// Progress survives closing and reopening the store.
func TestPartialResumesAfterReopen(t *testing.T) {
	ctx := context.Background()
	src := newStore(t)
	dir := t.TempDir()
	size := int64(37*GroupSize + 11)
	data := randData(41, size)
	c := put(t, src, data).CID

	dst, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := dst.OpenPartial(c, size)
	for _, g := range []int64{0, 5, 6, 7, 36} {
		n := min(GroupSize, size-g*GroupSize)
		slice, err := src.AppendSlice(nil, c, g*GroupSize, n)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WriteSlice(g*GroupSize, n, slice); err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.Close(); err != nil { // closes the partial too
		t.Fatal(err)
	}

	dst, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	parts, _ := dst.Partials()
	if parts[c] != size {
		t.Fatalf("Partials() = %v; want %s of %d bytes", parts, c, size)
	}
	p, err = dst.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	want := []Range{{GroupSize, 4 * GroupSize}, {8 * GroupSize, 28 * GroupSize}, {37 * GroupSize, 11}}
	got := p.Missing()
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("missing after reopen %v; want %v", got, want)
	}
	for _, m := range got {
		slice, _ := src.AppendSlice(nil, c, m.Off, m.Len)
		if err := p.WriteSlice(m.Off, m.Len, slice); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, size)
	if _, err := dst.ReadAt(c, back, 0); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("resumed blob differs: %v", err)
	}
	if parts, _ := dst.Partials(); len(parts) != 0 {
		t.Fatalf("partial record left after Finish: %v", parts)
	}
}

// A fetched collection is recognized and links its shards.
func TestFetchedCollectionIsLinked(t *testing.T) {
	ctx := context.Background()
	src, dst := newStore(t), newStore(t)
	sh := put(t, src, randData(42, 1000))
	col, _ := src.PutCollection(ctx, &Collection{Size: 1000, Shards: []Shard{{sh.CID, 1000}}})
	p, _ := dst.OpenPartial(col.CID, col.Size)
	slice, _ := src.AppendSlice(nil, col.CID, 0, col.Size)
	if err := p.WriteSlice(0, col.Size, slice); err != nil {
		t.Fatal(err)
	}
	inf, err := p.Finish(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !inf.Collection {
		t.Fatal("fetched collection not flagged")
	}
	if links, _ := dst.Links(col.CID); len(links) != 1 || links[0] != sh.CID {
		t.Fatalf("links %v", links)
	}
}

// A damaged partial record (bits past the last group, a length that does
// not match its size, an absurd size) starts the download over instead of
// claiming groups that were never verified, and Partials leaves it out.
func TestCorruptPartialRecordStartsOver(t *testing.T) {
	data := randData(80, 100)
	c := Sum(data)
	for name, rec := range map[string][]byte{
		"bit past the last group": encodePartialRecord(100, []uint64{2}),
		"extra word":              encodePartialRecord(100, []uint64{0, 1}),
		"no words":                encodePartialRecord(100, nil),
		"absurd size":             binary.LittleEndian.AppendUint64(nil, 1<<62+5),
		"torn":                    {100, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			// An outboard as a flushed download leaves it.
			os.WriteFile(s.partialPath(c, ".obao"), binary.LittleEndian.AppendUint64(nil, 100), 0o644)
			if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPartial).Put(c.key(), rec) }); err != nil {
				t.Fatal(err)
			}
			if parts, _ := s.Partials(); len(parts) != 0 && parts[c] != 100 {
				t.Fatalf("Partials lists %v from a damaged record", parts)
			}
			p, err := s.OpenPartial(c, 100)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.Complete() || p.Have(0, 100) {
				t.Fatal("a damaged record made unverified bytes count as verified")
			}
			if m := p.Missing(); len(m) != 1 || m[0] != (Range{0, 100}) {
				t.Fatalf("Missing %v; want the whole blob", m)
			}
		})
	}
}

// A download in progress serves the groups it has verified, with their
// proofs, byte for byte as the complete blob would; never a group it has
// not verified, and never bytes the disk changed after verification. A
// third store rebuilds the blob from the partial one alone.
func TestPartialServesVerifiedGroups(t *testing.T) {
	ctx := context.Background()
	src, mid, dst := newStore(t), newStore(t), newStore(t)
	size := int64(40*GroupSize + 123)
	data := randData(77, size)
	c := put(t, src, data).CID
	if _, _, ok := mid.PartialVerified(c); ok {
		t.Fatal("PartialVerified true before any download")
	}
	p, err := mid.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	// Groups 0..9 and 20..40 (the last, short one included).
	for _, r := range []Range{{0, 10 * GroupSize}, {20 * GroupSize, size - 20*GroupSize}} {
		slice, err := src.AppendSlice(nil, c, r.Off, r.Len)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.WriteSlice(r.Off, r.Len, slice); err != nil {
			t.Fatal(err)
		}
	}
	gotSize, groups, ok := mid.PartialVerified(c)
	if !ok || gotSize != size {
		t.Fatalf("PartialVerified = %d, %v; want %d, true", gotSize, ok, size)
	}
	for g := int64(0); g < 41; g++ {
		want := g < 10 || g >= 20
		if got := groups[g/64]&(1<<(g%64)) != 0; got != want {
			t.Fatalf("group %d verified = %v; want %v", g, got, want)
		}
	}
	for _, r := range []Range{{0, 1}, {0, 10 * GroupSize}, {3 * GroupSize, 5000}, {20 * GroupSize, size - 20*GroupSize}, {size - 1, 1}} {
		got, err := mid.AppendPartialSlice(nil, c, r.Off, r.Len)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		want, _ := src.AppendSlice(nil, c, r.Off, r.Len)
		if !bytes.Equal(got, want) {
			t.Fatalf("%+v: partial slice differs from the whole blob's", r)
		}
	}
	for _, r := range []Range{{10 * GroupSize, 1}, {9 * GroupSize, 2 * GroupSize}, {0, size}} {
		if _, err := mid.AppendPartialSlice(nil, c, r.Off, r.Len); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%+v (not verified): err %v; want ErrNotFound", r, err)
		}
	}
	for _, r := range []Range{{-1, 5}, {0, 0}, {size, 1}, {size - 1, 2}} {
		if _, err := mid.AppendPartialSlice(nil, c, r.Off, r.Len); err == nil {
			t.Fatalf("%+v: no error", r)
		}
	}
	// The third store takes the verified part from the partial one.
	q, err := dst.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []Range{{0, 10 * GroupSize}, {20 * GroupSize, size - 20*GroupSize}} {
		slice, err := mid.AppendPartialSlice(nil, c, r.Off, r.Len)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.WriteSlice(r.Off, r.Len, slice); err != nil {
			t.Fatal(err)
		}
	}
	// A verified group changed on disk is not served.
	f, err := os.OpenFile(mid.partialPath(c, ".data"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{data[3*GroupSize+7] ^ 1}, 3*GroupSize+7)
	f.Close()
	if _, err := mid.AppendPartialSlice(nil, c, 3*GroupSize, GroupSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("changed group: err %v; want ErrCorrupt", err)
	}
	if _, err := mid.AppendPartialSlice(nil, c, 4*GroupSize, GroupSize); err != nil {
		t.Fatalf("the group next to it: %v", err)
	}
	p.Close()
	if _, err := mid.AppendPartialSlice(nil, c, 0, GroupSize); !errors.Is(err, ErrNotFound) {
		t.Fatalf("closed download: err %v; want ErrNotFound", err)
	}
	if _, _, ok := mid.PartialVerified(c); ok {
		t.Fatal("PartialVerified true after Close")
	}
	// dst finishes from src and holds the exact blob.
	slice, _ := src.AppendSlice(nil, c, 10*GroupSize, 10*GroupSize)
	if err := q.WriteSlice(10*GroupSize, 10*GroupSize, slice); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := dst.ReadAt(c, got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("rebuilt blob differs (%v)", err)
	}
}

// WriteSliceFunc hands over the data of the groups it verified, at their
// offsets, covering the groups the slice covers (a range that is not
// group-aligned, and the blob's short last group), and nothing of a
// slice that fails.
func TestWriteSliceFuncHandsOverVerifiedData(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	size := int64(8*GroupSize + 333)
	data := randData(41, size)
	c := put(t, src, data).CID
	p, err := dst.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got := make([]byte, size)
	var handed int64
	fn := func(off int64, b []byte) {
		if off%GroupSize != 0 {
			t.Errorf("data handed at %d, not at a group", off)
		}
		copy(got[off:], b)
		handed += int64(len(b))
	}
	// A bad slice: nothing handed over.
	off, n := int64(GroupSize+100), int64(3*GroupSize)
	slice, _ := src.AppendSlice(nil, c, off, n)
	bad := bytes.Clone(slice)
	bad[len(bad)-10] ^= 1
	if err := p.WriteSliceFunc(off, n, bad, fn); err == nil {
		t.Fatal("a bad slice was accepted")
	}
	if handed != 0 {
		t.Fatalf("a bad slice handed over %d bytes", handed)
	}
	// [GroupSize+100, 4 GroupSize+100) covers groups 1-4.
	if err := p.WriteSliceFunc(off, n, slice, fn); err != nil {
		t.Fatal(err)
	}
	if handed != 4*GroupSize || !bytes.Equal(got[GroupSize:5*GroupSize], data[GroupSize:5*GroupSize]) {
		t.Fatalf("handed %d bytes; want groups 1-4's %d, equal to the blob's", handed, 4*GroupSize)
	}
	// The last groups, the short one included.
	off, n = 6*GroupSize, size-6*GroupSize
	slice, _ = src.AppendSlice(nil, c, off, n)
	if err := p.WriteSliceFunc(off, n, slice, fn); err != nil {
		t.Fatal(err)
	}
	if handed != 4*GroupSize+n || !bytes.Equal(got[off:], data[off:]) {
		t.Fatalf("handed %d bytes in all; want %d", handed, 4*GroupSize+n)
	}
}

// A flush that a write starts syncs without the download's lock: while
// its sync waits on the disk, the download's state is read, its verified
// groups are served and other slices are written; what it made durable
// is what the download held when it started.
func TestPartialFlushDoesNotBlock(t *testing.T) {
	fx := newFlushFixture(t, 43, 8*GroupSize+5)
	dst, c, write := fx.dst, fx.c, fx.write
	// The next sync of a partial file waits for release.
	entered, release := make(chan struct{}), make(chan struct{})
	var armed, released sync.Once
	t.Cleanup(func() {
		released.Do(func() { close(release) }) // else Close waits for the flush
		dst.Close()
	})
	real := dst.fs.syncFile
	dst.fs.syncFile = func(f *os.File) error {
		if strings.HasSuffix(f.Name(), ".data") {
			armed.Do(func() {
				close(entered)
				<-release
			})
		}
		return real(f)
	}
	p, err := dst.OpenPartial(c, fx.size)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(p, 0); err != nil {
		t.Fatal(err)
	}
	fx.tick() // the next write flushes
	flushed := make(chan error, 1)
	go func() { flushed <- write(p, 1) }()
	select {
	case <-entered:
	case err := <-flushed:
		t.Fatalf("the write returned (%v) without syncing the data file", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the write due for a flush did not sync")
	}

	// All of this while the flush's sync waits.
	done := make(chan error, 1)
	go func() {
		if _, groups, ok := dst.PartialVerified(c.Raw()); !ok || groups[0]&3 != 3 {
			done <- fmt.Errorf("PartialVerified: %v %b; want groups 0 and 1", ok, groups)
			return
		}
		if _, err := dst.AppendPartialSlice(nil, c.Raw(), 0, GroupSize); err != nil {
			done <- fmt.Errorf("serving a verified group: %v", err)
			return
		}
		done <- write(p, 2)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reading, serving or writing the download waited for its flush's sync")
	}
	released.Do(func() { close(release) })
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}

	// What the flush claimed is durable, and only that: the record names
	// groups 0 and 1, not 2, written while it synced.
	var rec []byte
	dst.db.View(func(tx *bolt.Tx) error {
		rec = append(rec, tx.Bucket(bucketPartial).Get(c.key())...)
		return nil
	})
	if _, have, err := decodePartialRecord(rec); err != nil || have[0] != 0b011 {
		t.Fatalf("record after the flush: %b, %v; want groups 0 and 1 only", have, err)
	}
	// The rest resumes and finishes as usual.
	fx.finish(p, 3)
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// After a failed sync of the data file, the groups no flush had made
// durable are dropped and fetched again: their pages may be gone, and a
// later sync would report success without them.
func TestPartialDropsGroupsAfterFailedSync(t *testing.T) {
	fx := newFlushFixture(t, 47, 6*GroupSize+9)
	dst, c, write, tick := fx.dst, fx.c, fx.write, fx.tick
	defer dst.Close()
	var fail sync.Mutex
	failing := false
	real := dst.fs.syncFile
	dst.fs.syncFile = func(f *os.File) error {
		fail.Lock()
		defer fail.Unlock()
		if failing && strings.HasSuffix(f.Name(), ".data") {
			failing = false
			return errors.New("EIO")
		}
		return real(f)
	}
	p, err := dst.OpenPartial(c, fx.size)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []int64{0, 1} { // a flush after group 1 makes both durable
		if g == 1 {
			tick()
		}
		if err := write(p, g); err != nil {
			t.Fatal(err)
		}
	}
	if err := write(p, 2); err != nil {
		t.Fatal(err)
	}
	fail.Lock()
	failing = true
	fail.Unlock()
	tick()
	if err := write(p, 3); !errors.Is(err, errDataSync) { // its flush fails
		t.Fatalf("write with a failing sync: %v; want errDataSync", err)
	}
	want := []Range{{2 * GroupSize, 4*GroupSize + 9}}
	if got := p.Missing(); len(got) != 1 || got[0] != want[0] {
		t.Fatalf("missing after the failed sync %v; want %v (groups 2 and 3 dropped)", got, want)
	}
	fx.finish(p, 2)
}

// flushFixture is a download of a blob of size bytes (random, from seed)
// held by src into dst, a store whose clock moves only by tick.
type flushFixture struct {
	t        *testing.T
	src, dst *Store
	c        CID
	data     []byte
	size     int64
	clock    sync.Mutex
	now      time.Time
}

func newFlushFixture(t *testing.T, seed uint64, size int64) *flushFixture {
	fx := &flushFixture{t: t, src: newStore(t), size: size, data: randData(seed, size), now: time.Unix(1e9, 0)}
	fx.c = put(t, fx.src, fx.data).CID
	var err error
	fx.dst, err = Open(t.TempDir(), Options{Now: func() time.Time { fx.clock.Lock(); defer fx.clock.Unlock(); return fx.now }})
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// tick moves dst's clock by flushEvery: the next write flushes.
func (fx *flushFixture) tick() {
	fx.clock.Lock()
	fx.now = fx.now.Add(flushEvery)
	fx.clock.Unlock()
}

// write writes group g of the blob into p.
func (fx *flushFixture) write(p *Partial, g int64) error {
	n := min(GroupSize, fx.size-g*GroupSize)
	b, err := fx.src.AppendSlice(nil, fx.c, g*GroupSize, n)
	if err != nil {
		fx.t.Fatal(err)
	}
	return p.WriteSlice(g*GroupSize, n, b)
}

// finish writes the groups from g on into p, finishes it and checks the
// stored blob byte for byte.
func (fx *flushFixture) finish(p *Partial, g int64) {
	t := fx.t
	for ; g*GroupSize < fx.size; g++ {
		if err := fx.write(p, g); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Finish(context.Background()); err != nil {
		t.Fatal(err)
	}
	back := make([]byte, fx.size)
	if _, err := fx.dst.ReadAt(fx.c, back, 0); err != nil || !bytes.Equal(back, fx.data) {
		t.Fatalf("blob differs: %v", err)
	}
}

// open opens the fixture's download in dst and writes groups [0, n) into
// it (no flush: the clock stands).
func (fx *flushFixture) open(n int64) *Partial {
	p, err := fx.dst.OpenPartial(fx.c, fx.size)
	if err != nil {
		fx.t.Fatal(err)
	}
	for g := int64(0); g < n; g++ {
		if err := fx.write(p, g); err != nil {
			fx.t.Fatal(err)
		}
	}
	return p
}

// blockSync makes dst's next file sync wait: entered is closed once it is
// in it, and unblock (called once) lets it go on and restores the plain
// sync for later ones.
func (fx *flushFixture) blockSync() (entered <-chan struct{}, unblock func()) {
	in, release := make(chan struct{}), make(chan struct{})
	sync0 := fx.dst.fs.syncFile
	fx.dst.fs.syncFile = func(f *os.File) error {
		close(in)
		<-release
		return sync0(f)
	}
	return in, func() {
		fx.dst.fs.syncFile = sync0
		close(release)
	}
}

// TestReopenWaitsForFinalFlush checks that an OpenPartial of a download
// whose last holder is closing it waits for the close's final flush, and
// then resumes from what that flush made durable.
func TestReopenWaitsForFinalFlush(t *testing.T) {
	fx := newFlushFixture(t, 41, 6*GroupSize)
	p := fx.open(3)
	entered, unblock := fx.blockSync()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	<-entered // the final flush is in its data sync
	reopened := make(chan *Partial, 1)
	go func() {
		q, err := fx.dst.OpenPartial(fx.c, fx.size)
		if err != nil {
			t.Error(err)
		}
		reopened <- q
	}()
	var q *Partial
	select {
	case q = <-reopened:
		t.Error("OpenPartial returned while the close's final flush was still syncing")
	case <-time.After(100 * time.Millisecond):
	}
	unblock()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if q == nil {
		q = <-reopened
	}
	if q == nil {
		t.FailNow()
	}
	if !q.Have(0, 3*GroupSize) {
		t.Fatalf("reopened download lacks the groups the close made durable: missing %v", q.Missing())
	}
	fx.finish(q, 3)
}

// TestEvictRuns checks the runs evictOld drops: each run of groups set
// in older and not yet evicted once, across words, with gaps, up to the
// last group of a short last word, and nothing twice.
func TestEvictRuns(t *testing.T) {
	older := make([]uint64, 3) // 150 groups: the last word partly used
	set := func(b []uint64, from, to int64) {
		for g := from; g < to; g++ {
			b[g/64] |= 1 << (g % 64)
		}
	}
	set(older, 0, 3)
	set(older, 5, 6)
	set(older, 60, 70) // across a word
	set(older, 100, 101)
	set(older, 127, 150) // across a word, to the last group
	evicted := make([]uint64, 3)
	set(evicted, 62, 66) // already dropped: splits the run
	type run struct{ g, n int64 }
	var got []run
	evictRuns(older, evicted, func(g, n int64) { got = append(got, run{g, n}) })
	want := []run{{0, 3}, {5, 1}, {60, 2}, {66, 4}, {100, 1}, {127, 23}}
	if !slices.Equal(got, want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	wantEvicted := slices.Clone(older) // 62-65 are in older too
	if !slices.Equal(evicted, wantEvicted) {
		t.Fatalf("evicted %x, want %x", evicted, wantEvicted)
	}
	got = nil
	evictRuns(older, evicted, func(g, n int64) { got = append(got, run{g, n}) })
	if len(got) != 0 {
		t.Fatalf("dropped again: %v", got)
	}
}

// TestReopenDuringStoreClose checks that an OpenPartial waiting for the
// final flush of a download that Store.Close is closing fails with
// ErrClosed instead of opening a download that nothing would close.
func TestReopenDuringStoreClose(t *testing.T) {
	fx := newFlushFixture(t, 43, 4*GroupSize)
	fx.open(1)
	entered, unblock := fx.blockSync()
	closed := make(chan error, 1)
	go func() { closed <- fx.dst.Close() }()
	<-entered // Close's final flush of p is in its data sync
	reopened := make(chan error, 1)
	go func() {
		q, err := fx.dst.OpenPartial(fx.c, fx.size)
		if err == nil {
			q.Close()
		}
		reopened <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it reach the wait (it fails either way if it does not)
	unblock()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := <-reopened; !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenPartial during Store.Close: %v, want ErrClosed", err)
	}
}

// TestFinishCoolsOnlyItsOwnBlob checks that a download queues its blob
// for dropping from the page cache (cool) only when its file became the
// blob, not when a copy stored meanwhile was kept.
func TestFinishCoolsOnlyItsOwnBlob(t *testing.T) {
	for _, storedMeanwhile := range []bool{false, true} {
		fx := newFlushFixture(t, 47, 3*GroupSize)
		p, err := fx.dst.OpenPartial(fx.c, fx.size)
		if err != nil {
			t.Fatal(err)
		}
		if storedMeanwhile {
			put(t, fx.dst, fx.data)
		}
		fx.finish(p, 0)
		fx.dst.cmu.Lock()
		n := len(fx.dst.cooling)
		fx.dst.cmu.Unlock()
		if want := map[bool]int{false: 1, true: 0}[storedMeanwhile]; n != want {
			t.Errorf("stored meanwhile %v: %d blobs cooling, want %d", storedMeanwhile, n, want)
		}
	}
}

// TestCoolingBounded checks that the queue of finished blobs waiting to
// leave the page cache holds at most maxCooling, forgetting the oldest.
func TestCoolingBounded(t *testing.T) {
	s := newStore(t)
	for i := range maxCooling + 3 {
		s.cool(fmt.Sprint(i))
	}
	if n := len(s.cooling); n != maxCooling {
		t.Fatalf("%d blobs queued, want %d", n, maxCooling)
	}
	if first := s.cooling[0].path; first != "3" {
		t.Fatalf("oldest queued %q, want 3 (0-2 forgotten)", first)
	}
}

// TestStoreCloseWaitsForClosingPartial checks that Store.Close waits for
// the final flush of a download that its last holder is closing at that
// moment, so that the flush's record reaches the index before it closes:
// the store opened again resumes from every group written.
func TestStoreCloseWaitsForClosingPartial(t *testing.T) {
	fx := newFlushFixture(t, 53, 6*GroupSize)
	p := fx.open(4)
	entered, unblock := fx.blockSync()
	released := make(chan error, 1)
	go func() { released <- p.Close() }()
	<-entered // the download's final flush is in its data sync
	closed := make(chan error, 1)
	go func() { closed <- fx.dst.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Store.Close returned (%v) while a download's final flush was running", err)
	case <-time.After(100 * time.Millisecond):
	}
	unblock()
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	s, err := Open(fx.dst.dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	q, err := s.OpenPartial(fx.c, fx.size)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if got, want := len(q.Missing()), 1; got != want || q.Missing()[0].Off != 4*GroupSize {
		t.Fatalf("reopened with missing %v; want only the last 2 groups", q.Missing())
	}
}
