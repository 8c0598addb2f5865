//go:build !js

package swarm

import (
	"context"

	"github.com/rdrr/peer/cas"
)

// Fetch is FetchTo the store st.
func (n *Node) Fetch(ctx context.Context, st *cas.Store, c cas.CID, opt FetchOptions) (cas.Info, error) {
	return n.FetchTo(ctx, casStore{st}, c, opt)
}

// casStore is a *cas.Store as a Store: its OpenPartial returns the
// concrete *cas.Partial.
type casStore struct{ *cas.Store }

func (s casStore) OpenPartial(c cas.CID, size int64) (Partial, error) {
	p, err := s.Store.OpenPartial(c, size)
	if err != nil {
		return nil, err // not a typed nil in an interface
	}
	return p, nil
}
