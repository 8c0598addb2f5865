//go:build !js

package cas

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
)

// The unchecked slices are the verified ones, byte for byte, for ranges
// of every shape; refusals are the same.
func TestUncheckedSlicesMatchVerified(t *testing.T) {
	src, mid := newStore(t), newStore(t)
	size := int64(300*GroupSize + 123)
	data := randData(31, size)
	c := put(t, src, data).CID
	p, err := mid.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, r := range []Range{{0, 64 * GroupSize}, {100 * GroupSize, size - 100*GroupSize}} {
		slice, _ := src.AppendSlice(nil, c, r.Off, r.Len)
		if err := p.WriteSlice(r.Off, r.Len, slice); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []Range{{0, 1}, {0, 16 * GroupSize}, {GroupSize, 3*GroupSize + 5}, {17 * GroupSize, 40 * GroupSize},
		{100 * GroupSize, 256 << 10}, {100 * GroupSize, size - 100*GroupSize}, {size - 1, 1}, {size - 5000, 5000}, {size - maxRead, maxRead}} {
		want, err := src.AppendSlice([]byte("hdr"), c, r.Off, r.Len)
		if err != nil {
			t.Fatal(err)
		}
		got, err := src.AppendSliceUnchecked([]byte("hdr"), c, r.Off, r.Len)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%+v: AppendSliceUnchecked differs from AppendSlice (%v)", r, err)
		}
		if held := r.Off+r.Len <= 64*GroupSize || r.Off >= 100*GroupSize; !held {
			continue // not all verified in the download
		}
		got, err = mid.AppendPartialSliceUnchecked([]byte("hdr"), c, r.Off, r.Len)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%+v: AppendPartialSliceUnchecked differs from AppendSlice (%v)", r, err)
		}
	}
	for _, r := range []Range{{64 * GroupSize, 1}, {63 * GroupSize, 2 * GroupSize}} {
		if _, err := mid.AppendPartialSliceUnchecked(nil, c, r.Off, r.Len); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%+v (not verified): err %v; want ErrNotFound", r, err)
		}
	}
	for _, r := range []Range{{-1, 5}, {0, 0}, {size, 1}, {size - 1, 2}, {0, maxRead + GroupSize}} {
		if _, err := src.AppendSliceUnchecked(nil, c, r.Off, r.Len); err == nil {
			t.Fatalf("%+v: no error", r)
		}
		if _, err := mid.AppendPartialSliceUnchecked(nil, c, r.Off, r.Len); err == nil {
			t.Fatalf("partial %+v: no error", r)
		}
	}
	if _, err := src.AppendSliceUnchecked(nil, Sum([]byte("absent")), 0, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent blob: %v; want ErrNotFound", err)
	}
}

// A byte flipped on disk in a stored blob is served by the unchecked
// path, refused by the receiver (which names the group), and found by
// CheckRange, which marks the blob corrupt: it is then served by neither
// path, and Scrub reports it too.
func TestUncheckedCorruptionCaughtByReceiverAndCheck(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	size := int64(40*GroupSize + 9)
	data := randData(32, size)
	c := put(t, src, data).CID
	const g = 21
	f, err := os.OpenFile(src.blobPath(c), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{data[g*GroupSize+7] ^ 4}, g*GroupSize+7)
	f.Close()

	off, n := int64(16*GroupSize), int64(16*GroupSize)
	slice, err := src.AppendSliceUnchecked(nil, c, off, n)
	if err != nil {
		t.Fatalf("unchecked slice of a flipped group: %v; want it served as stored", err)
	}
	p, err := dst.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var re *RangeError
	if err := p.WriteSlice(off, n, slice); !errors.As(err, &re) || re.Off != g*GroupSize || re.Len != GroupSize {
		t.Fatalf("receiver: %v; want a *RangeError naming group %d", err, g)
	}
	if err := src.CheckRange(c, 0, 8*GroupSize); err != nil {
		t.Fatalf("CheckRange of good groups: %v", err)
	}
	if inf, _ := src.Stat(c); inf.Corrupt {
		t.Fatal("marked corrupt after a good check")
	}
	if err := src.CheckRange(c, off, n); !errors.As(err, &re) || re.Off != g*GroupSize {
		t.Fatalf("CheckRange: %v; want a *RangeError naming group %d", err, g)
	}
	if inf, err := src.Stat(c); err != nil || !inf.Corrupt {
		t.Fatalf("Stat after a failed check: %+v, %v; want corrupt", inf, err)
	}
	if _, err := src.AppendSliceUnchecked(nil, c, 0, GroupSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("unchecked slice of a blob marked corrupt: %v; want ErrCorrupt", err)
	}
	if _, err := src.AppendSlice(nil, c, 0, GroupSize); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("slice of a blob marked corrupt: %v; want ErrCorrupt", err)
	}
	rep, err := src.Scrub(context.Background(), ScrubOptions{})
	if err != nil || len(rep.Bad) != 1 || rep.Bad[0].CID != c {
		t.Fatalf("scrub: %+v, %v; want %s bad", rep, err, c)
	}
}

// A verified group of a download that the disk changed is served by the
// unchecked path; CheckRange finds it, marks it missing again (so the
// download fetches it anew and nobody is served it), and keeps the rest.
func TestUncheckedPartialCorruptionMarkedMissing(t *testing.T) {
	ctx := context.Background()
	src, mid := newStore(t), newStore(t)
	size := int64(20*GroupSize + 5)
	data := randData(33, size)
	c := put(t, src, data).CID
	p, err := mid.OpenPartial(c, size)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	slice, _ := src.AppendSlice(nil, c, 0, size)
	if err := p.WriteSlice(0, size, slice); err != nil {
		t.Fatal(err)
	}
	const g = 9
	f, err := os.OpenFile(mid.partialPath(c, ".data"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{data[g*GroupSize+1] ^ 1}, g*GroupSize+1)
	f.Close()
	if _, err := mid.AppendPartialSliceUnchecked(nil, c, g*GroupSize, GroupSize); err != nil {
		t.Fatalf("unchecked partial slice of a changed group: %v; want it served as stored", err)
	}
	var re *RangeError
	if err := mid.CheckRange(c, 8*GroupSize, 4*GroupSize); !errors.As(err, &re) || re.Off != g*GroupSize || re.Len != GroupSize {
		t.Fatalf("CheckRange: %v; want a *RangeError naming group %d", err, g)
	}
	if got := p.Missing(); len(got) != 1 || got[0] != (Range{g * GroupSize, GroupSize}) {
		t.Fatalf("Missing after the check: %v; want group %d", got, g)
	}
	if _, err := mid.AppendPartialSliceUnchecked(nil, c, g*GroupSize, GroupSize); !errors.Is(err, ErrNotFound) {
		t.Fatalf("group marked missing served: %v; want ErrNotFound", err)
	}
	if err := mid.CheckRange(c, 0, size); err != nil {
		t.Fatalf("second check: %v; want the bad group skipped", err)
	}
	// Fetched again, the download finishes with the right bytes.
	slice, _ = src.AppendSlice(nil, c, g*GroupSize, GroupSize)
	if err := p.WriteSlice(g*GroupSize, GroupSize, slice); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := mid.ReadAt(c, got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("finished blob differs (%v)", err)
	}
	if err := mid.CheckRange(Sum([]byte("absent")), 0, 1); !errors.Is(err, ErrNotFound) {
		t.Fatalf("CheckRange of an absent blob: %v; want ErrNotFound", err)
	}
}
