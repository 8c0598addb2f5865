package swarm

import (
	"bytes"
	"context"
	"errors"
	"testing"

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
