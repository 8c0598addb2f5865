package main

import "github.com/rdrr/peer/experts"

// defaultBudget is --vram's and --ram's value where the machine cannot be
// asked.
const defaultBudget = 8 << 30

// autoRAM is generate's RAM budget when --ram is not given: half of what
// the machine has available (avail, /proc/meminfo's MemAvailable), and no
// more than every expert of m with 64 MiB to spare; defaultBudget where
// avail is not known.
func autoRAM(m *experts.Manifest, avail int64) int64 {
	if avail <= 0 {
		return defaultBudget
	}
	return max(min(avail/2, experts.Mount(m, experts.Budgets{}).PagedBytes+64<<20), 1<<20)
}

// arenaBytes is what every expert of m takes in a GPU arena of perBank
// slots a buffer (experts.ArenaSlots: a layer's matrices in one buffer),
// and the least an arena can hold and run: one layer's chosen matrices.
func arenaBytes(m *experts.Manifest, perBank int) (all, least int64) {
	mat := experts.ExpertMatrixBytes(m)
	return int64(experts.ArenaSlots(m, perBank)) * mat, 3 * int64(m.Config.NumExpertsPerTok) * mat
}

// autoVRAM is the GPU engine's VRAM budget (its expert arena) when --vram
// is not given: 90% of the GPU's device-local memory (heap bytes) less
// what else the model puts there (its dense weights, a KV cache of
// maxPos positions) and 2 GiB for activations, scratch and the driver;
// no more than every expert of m takes in an arena of perBank slots a
// buffer, and no less than one layer's chosen matrices (arenaBytes; the
// engine then says what the budget holds). ok is false where the heap is
// not known (0), so that the flag's default stands.
//
// free, where the driver says (VK_EXT_memory_budget), is what this process
// can still allocate from the heap: other processes' allocations are not
// there to take, so the 90% is of no more than that.
func autoVRAM(m *experts.Manifest, heap, free uint64, maxPos, perBank int) (budget int64, ok bool) {
	if heap == 0 {
		return 0, false
	}
	base := 0.9 * float64(heap)
	if free > 0 {
		base = min(base, 0.9*float64(free))
	}
	c := &m.Config
	dense := experts.Mount(m, experts.Budgets{}).ResidentBytes
	kv := int64(maxPos) * int64(c.NumHiddenLayers) * int64(c.NumKeyValueHeads) * int64(c.HeadDimension()) * 2 * 4
	room := int64(base) - dense - kv - 2<<30
	all, least := arenaBytes(m, perBank)
	return max(min(room, all), least), true
}
