// Package tiers will own the four-level cache of expert byte ranges: VRAM
// (gpu buffers), RAM, disk (cas) and swarm, with byte budgets per level,
// leases that pin what a kernel is using, pluggable eviction policies
// measured against Belady's optimum, a cancellable priority prefetch queue,
// and per-level statistics. See DESIGN.md, "Tiers". Not built yet: this
// file only fixes the package's place in the layout.
package tiers
