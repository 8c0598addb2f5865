package p2p

import (
	"fmt"

	"github.com/ipfs/go-cid"
	"github.com/rdrr/peer/cas"
)

// goCID converts c to the go-cid type the DHT takes. The DHT keys provider
// records by the multihash alone, so the raw and the collection CID of the
// same bytes share their records, as peers share blobs by digest.
func goCID(c cas.CID) (cid.Cid, error) {
	gc, err := cid.Cast(c.Binary())
	if err != nil {
		return cid.Undef, fmt.Errorf("p2p: cid %s: %w", c, err)
	}
	return gc, nil
}
