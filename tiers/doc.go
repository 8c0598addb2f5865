// Package tiers is the four-level cache of expert byte ranges: VRAM (slots
// of a GPU arena), RAM, disk (the cas store, verified reads over several
// cores) and swarm (ranges fetched from peers through a SliceFetcher and
// verified with their bao proofs). Gets return leases that pin an entry
// until released; concurrent gets of one key share one load; prefetches
// queue by priority behind every demand and never evict a lease or a
// later demand; budgets are never exceeded. Eviction policies (LRU, LFU,
// GreedyDual-Size-Frequency, and Cycle, which learns the pager's layer
// cycle) are measured against Belady's MIN on traces in the format of
// TRACE.md. See DESIGN.md, "Tiers".
package tiers
