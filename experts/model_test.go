package experts

import (
	"context"
	"slices"
	"sort"
	"testing"

	"github.com/rdrr/peer/tiers"
)

// tinyInStore writes tiny-moe into a store and returns its manifest.
func tinyInStore(t *testing.T, seed uint64) (*Manifest, tiers.Source) {
	return presetInStore(t, "tiny-moe", seed)
}

// presetInStore writes a small preset into a store.
func presetInStore(t testing.TB, preset string, seed uint64) (*Manifest, tiers.Source) {
	p, err := PresetByName(preset)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := NewLayout(p, seed)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := lo.WriteModel(context.Background(), dir, false, nil); err != nil {
		t.Fatal(err)
	}
	st := openStore(t)
	_, m, err := AddModel(context.Background(), st, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m, tiers.DiskSource{Store: st}
}

func generate(t *testing.T, m *Manifest, src tiers.Source, ram int64, n int) ([]int, *RefModel, *tiers.Cache) {
	t.Helper()
	rec := &tiers.TraceRecorder{}
	cache, err := tiers.New(tiers.Config{RAM: ram, Disk: src, Policy: "lru", Trace: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	rm, err := NewRefModel(context.Background(), m, cache)
	if err != nil {
		t.Fatal(err)
	}
	rm.Trace = rec
	toks, err := rm.Generate(context.Background(), ByteTokens("The swarm is"), n, Sampling{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return toks, rm, cache
}

// Greedy generation with the experts paged through a cache that holds a
// quarter of them gives the tokens of a cache that holds them all.
func TestRefModelPagingKeepsTokens(t *testing.T) {
	m, src := tinyInStore(t, 1)
	var dense int64
	for _, tn := range m.Tensors {
		dense += tn.Size
	}
	dense -= int64(len(m.Experts)) * m.Experts[0].Size
	n := 16
	if raceEnabled && testing.Short() {
		n = 6 // the float64 engine is ten times slower under the race detector
	}
	full, _, _ := generate(t, m, src, m.TotalSize, n)
	quarter := dense + int64(len(m.Experts)/4)*m.Experts[0].Size
	paged, rm, cache := generate(t, m, src, quarter, n)
	if !slices.Equal(full, paged) {
		t.Fatalf("paged tokens %v differ from resident ones %v", paged, full)
	}
	ram := cache.Stats()[tiers.RAM]
	if ram.Evictions == 0 || ram.Misses <= int64(len(m.Experts)) {
		t.Fatalf("with a quarter of the experts: %d evictions, %d misses; paging did not happen", ram.Evictions, ram.Misses)
	}
	t.Logf("tokens %v; 25%% RAM: hit rate %.2f, %d evictions", paged, ram.HitRate, ram.Evictions)
	// Routing of the synthetic model is skewed: report it per layer.
	for l := 0; l < m.Config.NumHiddenLayers; l++ {
		var counts []int
		for e := 0; e < m.Config.Experts(); e++ {
			counts = append(counts, rm.Routes[[2]int{l, e}])
		}
		sort.Sort(sort.Reverse(sort.IntSlice(counts)))
		t.Logf("layer %d expert choices, most chosen first: %v", l, counts)
	}
}

// A different seed makes a different model: different tokens.
func TestRefModelDependsOnWeights(t *testing.T) {
	if raceEnabled && testing.Short() {
		t.Skip("two full generations, ten times slower under the race detector; the run without it (make test's first pass) covers it")
	}
	m1, s1 := tinyInStore(t, 1)
	m2, s2 := tinyInStore(t, 2)
	a, _, _ := generate(t, m1, s1, m1.TotalSize, 8)
	b, _, _ := generate(t, m2, s2, m2.TotalSize, 8)
	if slices.Equal(a, b) {
		t.Fatalf("two models of different seeds generated the same tokens %v", a)
	}
}

// The reference follows another engine's choice of experts only through
// near-ties: experts in one choice and not the other whose scores lie
// within the tie of the reference's lowest chosen score.
func TestNearTie(t *testing.T) {
	scores := []float64{1.0, 0.5, 0.499, 0.2, -1.0}
	for _, c := range []struct {
		want, got []int
		ok        bool
	}{
		{[]int{0, 1}, []int{0, 2}, true},  // 0.499 against the edge 0.5
		{[]int{0, 1}, []int{2, 0}, true},  // and in another order
		{[]int{0, 1}, []int{0, 3}, false}, // 0.2 is no tie
		{[]int{0, 1}, []int{3, 4}, false},
		{[]int{0, 1}, []int{1, 1}, false}, // an expert twice
		{[]int{0, 1}, []int{0, 5}, false}, // no such expert
		{[]int{0, 1}, []int{0}, false},
	} {
		if err := nearTie(scores, c.want, c.got, 0.01); (err == nil) != c.ok {
			t.Errorf("nearTie(%v, %v): %v; want ok %v", c.want, c.got, err, c.ok)
		}
	}
	if !sameSet([]int{2, 0}, []int{0, 2}) || sameSet([]int{3, 3}, []int{3, 7}) || sameSet([]int{1}, []int{1, 2}) {
		t.Error("sameSet: sets compared wrongly")
	}
}
