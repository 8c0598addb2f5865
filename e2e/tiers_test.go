package e2e

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/tiers"
)

// The tiers cache pages experts of a model that only another peer holds:
// its swarm level is swarm.Ranges, each expert one verified range, and the
// seeder serves little more than the experts asked for.
func TestTiersPageExpertsOverTheSwarm(t *testing.T) {
	url := startSignal(t)
	seeder := newLocalNode(t, url, t.TempDir(), "tiers")
	leecher := newLocalNode(t, url, t.TempDir(), "tiers")
	p, _ := experts.PresetByName("tiny-moe")
	lo, err := experts.NewLayout(p, 4)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := lo.WriteModel(context.Background(), dir, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := experts.AddModel(context.Background(), seeder.st, dir, nil); err != nil {
		t.Fatal(err)
	}
	m := lo.Manifest
	ranges := &swarm.Ranges{Node: leecher.Node, Discover: func(ctx context.Context) ([]peer.ID, error) {
		return leecher.Peers(), nil
	}}
	if err := leecher.Connect(ctxFor(t, 10*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	// RAM for a quarter of the experts: paging evicts.
	cache, err := tiers.New(tiers.Config{RAM: int64(len(m.Experts)/4) * m.Experts[0].Size, Swarm: tiers.SwarmSource{Fetcher: ranges}})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	ctx := ctxFor(t, 60*time.Second)
	var asked int64
	for _, e := range m.Experts[:8] {
		s := m.Shards[e.Shard]
		k := tiers.Key{Blob: s.CID(), Size: s.Size, Off: e.Offset, Len: e.Size}
		l, err := cache.Get(ctx, k, tiers.RAM)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, e.Size)
		if _, err := seeder.st.ReadAt(s.CID(), want, e.Offset); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(l.Bytes(), want) {
			t.Fatalf("expert %d/%d: wrong bytes", e.Layer, e.Index)
		}
		l.Release()
		asked += e.Size
	}
	served := seeder.Stats().ServedBytes
	if served > asked+8*2*16<<10 {
		t.Fatalf("the seeder served %d bytes for %d bytes of experts (the shard is %d)", served, asked, m.Shards[0].Size)
	}
	st := cache.Stats()
	if st[tiers.Swarm].Hits != 8 || st[tiers.RAM].Misses != 8 {
		t.Fatalf("stats: swarm %+v, ram %+v", st[tiers.Swarm], st[tiers.RAM])
	}
	t.Logf("8 experts (%d bytes) paged over the swarm; the seeder served %d bytes", asked, served)
}
