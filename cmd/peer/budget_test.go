package main

import (
	"testing"

	"github.com/rdrr/peer/experts"
)

func presetManifest(t *testing.T, name string) *experts.Manifest {
	t.Helper()
	p, err := experts.PresetByName(name)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := experts.NewLayout(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	return lo.Manifest
}

// The budgets generate takes when --vram and --ram are not given.
func TestAutoBudgets(t *testing.T) {
	mix := presetManifest(t, "mixtral-8x7b")
	ds := presetManifest(t, "deepseek-v3-671b")
	all := func(m *experts.Manifest) int64 {
		return int64(experts.ExpertMatrices(m)) * experts.ExpertMatrixBytes(m)
	}
	mat := experts.ExpertMatrixBytes(mix)
	perBank := int((2<<30 - 4) / mat) // the arena's buffers of 2 GiB
	inArena := int64(experts.ArenaSlots(mix, perBank)) * mat
	if all(mix) < 20<<30 || all(mix) > 40<<30 {
		t.Fatalf("Mixtral's experts take %d bytes; want 20-40 GiB", all(mix))
	}
	const gib = int64(1 << 30)
	for _, c := range []struct {
		name   string
		m      *experts.Manifest
		heap   uint64
		free   uint64 // 0: the driver does not say
		maxPos int
		want   func(int64) bool
		why    string
	}{
		{"Mixtral on 141 GB", mix, 141e9, 0, 4096, func(v int64) bool { return v == inArena && v > all(mix) }, "every expert, as the arena places them (a layer in one buffer)"},
		{"Mixtral on 24 GiB", mix, 24 << 30, 0, 4096, func(v int64) bool {
			dense := experts.Mount(mix, experts.Budgets{}).ResidentBytes
			heap := float64(24 << 30)
			room := int64(0.9*heap) - dense - 2*gib
			return v < inArena && v < room && v > room-2*gib
		}, "what 90% of it holds after the dense weights, the KV cache and 2 GiB"},
		{"Mixtral on 4 GiB", mix, 4 << 30, 0, 4096, func(v int64) bool { return v == 3*2*mat }, "one layer's chosen matrices, the least that runs"},
		{"Mixtral on 141 GB, 130 GB of it free", mix, 141e9, 130e9, 4096, func(v int64) bool { return v == inArena }, "every expert: what is free holds them"},
		{"Mixtral on 141 GB, 24 GiB of it free", mix, 141e9, 24 << 30, 4096, func(v int64) bool {
			dense := experts.Mount(mix, experts.Budgets{}).ResidentBytes
			free := float64(24 << 30)
			room := int64(0.9*free) - dense - 2*gib
			return v < room && v > room-2*gib
		}, "90% of what other processes leave, less the dense weights, the KV cache and 2 GiB"},
		{"DeepSeek-V3 on 141 GB", ds, 141e9, 0, 64, func(v int64) bool { return v < all(ds) && v > 100*gib && v < 127*gib }, "most of the GPU, far less than the experts"},
	} {
		got, ok := autoVRAM(c.m, c.heap, c.free, c.maxPos, int((2<<30-4)/experts.ExpertMatrixBytes(c.m)))
		if !ok || !c.want(got) {
			t.Errorf("%s: autoVRAM %d (%.1f GiB), ok %v; want %s", c.name, got, float64(got)/float64(gib), ok, c.why)
		}
	}
	if _, ok := autoVRAM(mix, 0, 0, 100, perBank); ok {
		t.Error("autoVRAM with the GPU's memory unknown: ok; want the flag's default to stand")
	}
	for _, c := range []struct {
		avail, want int64
	}{
		{0, defaultBudget},             // not known
		{100 * gib, all(mix) + 64<<20}, // every expert
		{16 * gib, 8 * gib},            // half of what is available
		{-1, defaultBudget},            // not known
	} {
		if got := autoRAM(mix, c.avail); got != c.want {
			t.Errorf("autoRAM(Mixtral, %d available) = %d; want %d", c.avail, got, c.want)
		}
	}
}
