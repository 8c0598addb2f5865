package experts

import (
	"context"
	"math"
	"slices"
	"sort"
	"testing"

	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ref"
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
	return shapeInStore(t, p, seed)
}

// shapeInStore is presetInStore of a shape p, a preset or not.
func shapeInStore(t testing.TB, p Preset, seed uint64) (*Manifest, tiers.Source) {
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

// refModel is the float64 reference engine of m, its weights read from
// src through a cache of its own that holds all of m and closes when the
// test ends.
func refModel(t testing.TB, m *Manifest, src tiers.Source) *RefModel {
	rm, _ := refModelWith(t, m, tiers.Config{RAM: m.TotalSize, Disk: src})
	return rm
}

// refModelWith is refModel through a cache of configuration cfg, which it
// returns too.
func refModelWith(t testing.TB, m *Manifest, cfg tiers.Config) (*RefModel, *tiers.Cache) {
	t.Helper()
	cache, err := tiers.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	rm, err := NewRefModel(context.Background(), m, cache)
	if err != nil {
		t.Fatal(err)
	}
	return rm, cache
}

func generate(t *testing.T, m *Manifest, src tiers.Source, ram int64, n int) ([]int, *RefModel, *tiers.Cache) {
	t.Helper()
	rec := &tiers.TraceRecorder{}
	rm, cache := refModelWith(t, m, tiers.Config{RAM: ram, Disk: src, Policy: "lru", Trace: rec})
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
// within the tie of the reference's lowest chosen score, or, with a
// group limit, whose groups are near the kept groups' boundary.
func TestNearTie(t *testing.T) {
	softmax := ref.Route{Mode: abi.RouteSoftmaxTopK, K: 2}
	logits := []float64{1.0, 0.5, 0.499, 0.2, -1.0}
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
		if err := nearTie(logits, softmax, c.want, c.got, 0.01); (err == nil) != c.ok {
			t.Errorf("nearTie(%v, %v): %v; want ok %v", c.want, c.got, err, c.ok)
		}
	}
	// Two groups of two, one kept: group 0's two best sum to nearly
	// group 1's, so a choice from either group is a near-tie; with group 1
	// far behind, it is not.
	grouped := ref.Route{Mode: abi.RouteSigmoidTopK, K: 2, Groups: 2, TopKGroup: 1}
	inv := func(s float64) float64 { return math.Log(s / (1 - s)) } // the logit of sigmoid s
	tied := []float64{inv(0.9), inv(0.5), inv(0.7), inv(0.7001)}
	if ids, _ := ref.TopK(tied, 1, 4, grouped); !sameSet(ids, []int{2, 3}) {
		t.Fatalf("the reference chose %v; want group 1's [2 3]", ids)
	}
	if err := nearTie(tied, grouped, []int{3, 2}, []int{0, 1}, 0.01); err != nil {
		t.Errorf("groups near the boundary: %v", err)
	}
	apart := []float64{inv(0.9), inv(0.1), inv(0.7), inv(0.7)}
	if err := nearTie(apart, grouped, []int{2, 3}, []int{0, 1}, 0.01); err == nil {
		t.Error("a group far from the boundary taken for a near-tie")
	}
	if !sameSet([]int{2, 0}, []int{0, 2}) || sameSet([]int{3, 3}, []int{3, 7}) || sameSet([]int{1}, []int{1, 2}) {
		t.Error("sameSet: sets compared wrongly")
	}
}
