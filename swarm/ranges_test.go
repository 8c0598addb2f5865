package swarm

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
)

// A range fetch brings one verified range from whoever holds the blob,
// and only the groups that cover it cross the wire.
func TestRangesFetchOnlyTheRange(t *testing.T) {
	url := startSignal(t)
	seeder := newTestNode(t, url, nil)
	leecher := newTestNode(t, url, nil)
	data := randBytes(21, 8<<20)
	info := put(t, seeder.st, data)
	r := &Ranges{Node: leecher.Node, Discover: func(context.Context) ([]peer.ID, error) { return []peer.ID{seeder.ID()}, nil }}
	ctx := ctxFor(t, 30e9)
	off, n := int64(3<<20+16<<10), int64(1<<20)
	slice, err := r.FetchSlice(ctx, info.CID, int64(len(data)), off, n)
	if err != nil {
		t.Fatal(err)
	}
	start, end := bao.Cover(int64(len(data)), off, n)
	cover := make([]byte, end-start)
	var scratch [bao.GroupSize]byte
	if err := bao.DecodeSlice(cover, slice, info.CID.Digest(), int64(len(data)), off, n, &scratch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cover[off-start:off-start+n], data[off:off+n]) {
		t.Fatal("the range differs from the blob")
	}
	if served := seeder.Stats().ServedBytes; served > 2*n {
		t.Fatalf("the seeder served %d bytes for a %d-byte range of an %d-byte blob", served, n, len(data))
	}
	if leecher.st.Has(info.CID) {
		t.Fatal("a range fetch stored the whole blob")
	}
}

// A peer whose slices do not verify is banned and the range comes from an
// honest one.
func TestRangesBanLiar(t *testing.T) {
	url := startSignal(t)
	data := randBytes(22, 2<<20)
	var liarSrc *flipSource
	liar := newTestNode(t, url, func(c *Config) {
		liarSrc = &flipSource{Source: c.Source}
		c.Source = liarSrc
	})
	honest := newTestNode(t, url, nil)
	leecher := newTestNode(t, url, nil)
	info := put(t, liar.st, data)
	put(t, honest.st, data)
	liarSrc.at = info.CID
	liarSrc.needle = data[1<<20 : 1<<20+16]
	r := &Ranges{Node: leecher.Node, Discover: func(context.Context) ([]peer.ID, error) {
		return []peer.ID{liar.ID(), honest.ID()}, nil
	}}
	ctx := ctxFor(t, 30e9)
	for i := 0; i < 30; i++ { // holders are shuffled: ask until the liar was asked
		if _, err := r.FetchSlice(ctx, info.CID, int64(len(data)), 1<<20, 64<<10); err != nil {
			t.Fatal(err)
		}
		if liarSrc.flips.Load() > 0 {
			break
		}
		r.mu.Lock()
		r.asked = nil
		r.holders = nil
		r.mu.Unlock()
	}
	if liarSrc.flips.Load() == 0 {
		t.Fatal("the liar was never asked in 30 fetches")
	}
	if !leecher.Banned(liar.ID()) {
		t.Fatal("the liar served a bad slice and was not banned")
	}
	// With only the liar left, the fetch fails rather than return bad bytes.
	r2 := &Ranges{Node: newTestNode(t, url, nil).Node, Discover: func(context.Context) ([]peer.ID, error) { return []peer.ID{liar.ID()}, nil }}
	if _, err := r2.FetchSlice(ctx, info.CID, int64(len(data)), 1<<20, 64<<10); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("only a liar: %v; want ErrNotFound", err)
	}
}

// A range comes from a peer that holds only the pieces covering it (a
// download in progress, as its HAVE bitmap says); a range outside them is
// not asked of it.
func TestRangesFromPartialHolder(t *testing.T) {
	url := startSignal(t)
	data := randBytes(23, 6<<20+99)
	size := int64(len(data))
	src, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	info := put(t, src, data)
	var checks atomic.Int64 // the holder's look-ups of its download: one per WANT or REQUEST
	holder := newTestNode(t, url, func(c *Config) {
		c.Source = &countPartial{PartialSource: c.Source.(PartialSource), Source: c.Source, n: &checks}
	})
	// The holder's download has pieces 2 and 3 (bytes [2 MiB, 4 MiB)).
	part, err := holder.st.OpenPartial(info.CID, size)
	if err != nil {
		t.Fatal(err)
	}
	defer part.Close()
	slice, err := src.AppendSlice(nil, info.CID, 2<<20, 2<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := part.WriteSlice(2<<20, 2<<20, slice); err != nil {
		t.Fatal(err)
	}
	client := newTestNode(t, url, nil)
	r := &Ranges{Node: client.Node, Discover: func(context.Context) ([]peer.ID, error) { return []peer.ID{holder.ID()}, nil }}
	ctx := ctxFor(t, 30e9)
	off, n := int64(3<<20+32<<10), int64(256<<10)
	got, err := r.FetchSlice(ctx, info.CID, size, off, n)
	if err != nil {
		t.Fatal(err)
	}
	start, end := bao.Cover(size, off, n)
	cover := make([]byte, end-start)
	var scratch [bao.GroupSize]byte
	if err := bao.DecodeSlice(cover, got, info.CID.Digest(), size, off, n, &scratch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(cover[off-start:off-start+n], data[off:off+n]) {
		t.Fatal("the range differs from the blob")
	}
	// The holder counts a range once its last chunk is sent, which can
	// be after the client has it all.
	waitFor(t, func() bool { return holder.Stats().ServedPartialBytes >= n })
	served := holder.Stats().ServedPartialBytes
	if served != n {
		t.Fatalf("the holder served %d bytes from its download; want %d", served, n)
	}
	// Outside its pieces: not asked, not found; and it is no provider.
	before := checks.Load()
	if _, err := r.FetchSlice(ctx, info.CID, size, 5<<20, 64<<10); !errors.Is(err, cas.ErrNotFound) {
		t.Fatalf("a range outside the holder's pieces: %v; want ErrNotFound", err)
	}
	if got := checks.Load() - before; got != 0 {
		t.Fatalf("the holder was asked %d times for a range outside its pieces", got)
	}
	if ps, err := r.Providers(ctx, info.CID); err != nil || len(ps) != 0 {
		t.Fatalf("providers %v (%v); want none (the holder has pieces only)", ps, err)
	}
	if holder.Banned(client.ID()) || client.Banned(holder.ID()) {
		t.Fatal("a ban between honest peers")
	}
}

// countPartial counts the look-ups of downloads in progress.
type countPartial struct {
	PartialSource
	Source
	n *atomic.Int64
}

func (c *countPartial) PartialVerified(id cas.CID) (int64, []uint64, bool) {
	c.n.Add(1)
	return c.PartialSource.PartialVerified(id)
}

// The holders a Ranges remembers are bounded: past maxHolderBlobs blobs,
// expired answers go first, then any, and the blob just asked about is
// kept.
func TestRangesRemembersBoundedHolders(t *testing.T) {
	defer func(n int) { maxHolderBlobs = n }(maxHolderBlobs)
	maxHolderBlobs = 3
	var r Ranges
	cid := func(i int) cas.CID { return cas.Sum([]byte{byte(i)}) }
	t0 := time.Unix(1000, 0)
	got := map[peer.ID]holder{"p": {size: 1}}
	r.rememberLocked(cid(0), got, t0) // expired by the fourth
	r.rememberLocked(cid(1), got, t0.Add(holdersTTL))
	r.rememberLocked(cid(2), got, t0.Add(holdersTTL))
	now := t0.Add(holdersTTL + time.Second)
	r.rememberLocked(cid(3), got, now)
	if len(r.holders) != 3 || len(r.asked) != 3 || r.holders[cid(0)] != nil || r.holders[cid(3)] == nil {
		t.Fatalf("after a fourth blob: %d holders, %d asked; the expired one kept: %v", len(r.holders), len(r.asked), r.holders[cid(0)] != nil)
	}
	for i := 4; i < 100; i++ { // none expired: any goes, never the new one
		r.rememberLocked(cid(i), got, now)
		if len(r.holders) > 3 || len(r.asked) != len(r.holders) || r.holders[cid(i)] == nil {
			t.Fatalf("blob %d: %d holders, %d asked", i, len(r.holders), len(r.asked))
		}
	}
	r.rememberLocked(cid(99), got, now) // known: nothing is dropped
	if len(r.holders) != 3 {
		t.Fatalf("%d holders after a known blob", len(r.holders))
	}
}
