package p2p

import (
	"bytes"
	"testing"

	"github.com/multiformats/go-multihash"
	"github.com/rdrr/peer/cas"
)

func TestGoCID(t *testing.T) {
	d := cas.Sum([]byte("hello")).Digest()
	for _, c := range []cas.CID{cas.RawCID(d), cas.CollectionCID(d)} {
		gc, err := goCID(c)
		if err != nil {
			t.Fatal(err)
		}
		if gc.String() != c.String() {
			t.Fatalf("go-cid prints %s; want %s", gc, c)
		}
		if gc.Prefix().Codec != uint64(c.Codec()) {
			t.Fatalf("codec %#x; want %#x", gc.Prefix().Codec, uint64(c.Codec()))
		}
		dm, err := multihash.Decode(gc.Hash())
		if err != nil {
			t.Fatal(err)
		}
		if dm.Code != multihash.BLAKE3 || !bytes.Equal(dm.Digest, d[:]) {
			t.Fatalf("multihash %#x %x; want BLAKE3 %x", dm.Code, dm.Digest, d)
		}
	}
}
