//go:build !js

package browser

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/signaling/signalingtest"
	"github.com/rdrr/peer/swarm"
)

func startNode(t *testing.T, url string, src swarm.Source) *swarm.Node {
	t.Helper()
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	n, err := swarm.NewNode(swarm.Config{Identity: id, Source: src, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc, err := signaling.Dial(ctx, url, signaling.ClientConfig{Key: id.Key})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); sc.Close() })
	return n
}

// The code the page runs, natively: a node fetches into a Store (what a
// page keeps) from a native peer, then serves it to a third peer that
// fetches it into a cas.Store, byte-exact.
func TestFetchIntoStoreAndServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := signalingtest.Start(t, signaling.Config{RelayToAnyPeer: true})
	seedStore, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer seedStore.Close()
	data := randBytes(7, 3*pieceSize+12345)
	inf, err := seedStore.Put(ctx, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	seed := startNode(t, url, seedStore)

	page := openStore(t, NewMemFiles(), Options{})
	pn := startNode(t, url, page)
	if _, err := pn.FetchTo(ctx, page, inf.CID, swarm.FetchOptions{Peers: []peer.ID{seed.ID()}}); err != nil {
		t.Fatal(err)
	}
	if h, err := page.Hash(ctx, inf.CID); err != nil || cas.RawCID(cas.Digest(h)) != inf.CID {
		t.Fatalf("page hash %x, %v; want %s", h, err, inf.CID)
	}

	other, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	on := startNode(t, url, other)
	if _, err := on.Fetch(ctx, other, inf.CID, swarm.FetchOptions{Peers: []peer.ID{pn.ID()}}); err != nil {
		t.Fatal(err)
	}
	rd, err := other.Open(inf.CID)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	got := make([]byte, len(data))
	if _, err := rd.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched from the page: %v, equal %v", err, bytes.Equal(got, data))
	}
}

// A page serves the pieces of a download in progress (PROTOCOL.md, HAVE
// with bitmaps): a native peer fetching from a seeder and from a page that
// holds half the blob takes pieces from the page too.
func TestServeDownloadInProgress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := signalingtest.Start(t, signaling.Config{RelayToAnyPeer: true})
	seedStore, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer seedStore.Close()
	size := int64(16 * pieceSize)
	data := randBytes(9, int(size))
	inf, err := seedStore.Put(ctx, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	seed := startNode(t, url, seedStore)

	// The page holds every other piece, its download left open.
	page := openStore(t, NewMemFiles(), Options{})
	part, err := page.OpenPartial(inf.CID, size)
	if err != nil {
		t.Fatal(err)
	}
	defer part.Close()
	for off := int64(0); off < size; off += 2 * pieceSize {
		sl, err := seedStore.AppendSlice(nil, inf.CID, off, pieceSize)
		if err != nil {
			t.Fatal(err)
		}
		if err := part.WriteSlice(off, pieceSize, sl); err != nil {
			t.Fatal(err)
		}
	}
	pn := startNode(t, url, page)

	other, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	on := startNode(t, url, other)
	if _, err := on.Fetch(ctx, other, inf.CID, swarm.FetchOptions{Peers: []peer.ID{seed.ID(), pn.ID()}}); err != nil {
		t.Fatal(err)
	}
	rd, err := other.Open(inf.CID)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	got := make([]byte, len(data))
	if _, err := rd.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("fetched: %v, equal %v", err, bytes.Equal(got, data))
	}
	if s := pn.Stats(); s.ServedPartialBytes == 0 {
		t.Errorf("the page served nothing of its download in progress (%+v)", s)
	}
}
