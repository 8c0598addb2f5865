package swarm

import (
	"context"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// fakeReplOverlay answers Alive from a set of dead peers.
type fakeReplOverlay struct{ dead map[peer.ID]bool }

func (o fakeReplOverlay) Alive(_ context.Context, ps []peer.ID) []peer.ID {
	return slices.DeleteFunc(slices.Clone(ps), func(p peer.ID) bool { return o.dead[p] })
}
func (fakeReplOverlay) LiveProviders(context.Context, cas.CID, int) ([]peer.ID, error) {
	return nil, nil
}
func (fakeReplOverlay) PublishReplication(context.Context, []ReplicaTarget, bool) error {
	return nil
}
func (fakeReplOverlay) Replication() ([]ReplicaTarget, []peer.ID) { return nil, nil }

// Every replicator ranks alike: for a missing need copies exactly need of
// the live replicators that lack the shard choose themselves, none that
// holds it, and a dead replicator ranked ahead is passed over.
func TestReplicaChoiceIsConsistent(t *testing.T) {
	var ids []*Identity
	var all []peer.ID
	for range 8 {
		id, err := NewIdentity()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		all = append(all, id.ID)
	}
	for s := range 20 {
		shard := cas.Sum([]byte{byte(s)})
		holders := all[:2]
		for _, dead := range []map[peer.ID]bool{nil, {all[2+s%6]: true}} {
			for need := 1; need <= 3; need++ {
				var picked []peer.ID
				for i, id := range ids {
					if dead[id.ID] {
						continue // a dead peer decides nothing
					}
					r := &Replicator{cfg: ReplicatorConfig{Node: &Node{id: id}, Overlay: fakeReplOverlay{dead: dead}}}
					if slices.Contains(holders, all[i]) {
						continue // holders do not fetch (keep checks before chosen)
					}
					if r.chosen(context.Background(), shard, need, all, holders) {
						picked = append(picked, all[i])
					}
				}
				if len(picked) != need {
					t.Fatalf("shard %d, need %d, dead %v: %d replicators chose themselves", s, need, dead, len(picked))
				}
			}
		}
	}
}
