package tiers

import (
	"fmt"
	"math"
)

// A Policy ranks the entries of one level for eviction. The cache calls
// it under its lock: implementations need no locking of their own. Time is
// a logical clock that grows by one per access.
type Policy interface {
	// Name is the policy's name in reports.
	Name() string
	// Access records a demand hit on id, or its insertion (hit false).
	Access(id int, size int64, now int64, hit bool)
	// Remove forgets id (evicted or dropped).
	Remove(id int)
	// Score ranks id: the lowest score is evicted first. A score does not
	// change until id's next Access (so an eviction heap stays valid).
	Score(id int) float64
}

// A GroupPolicy is told each key's place in the pager's walk over a
// model (its layer): Cache.SetGroup, and a trace's key groups.
type GroupPolicy interface {
	SetGroup(id, group int)
}

// A StepPolicy is told when a decode step begins and which token it
// embeds (negative: unknown): Cache.BeginStep, and a trace's steps.
type StepPolicy interface {
	BeginStep(token int)
}

// A PrefetchPolicy is told of an insertion by a prefetch with Prefetched
// instead of Access: a key loaded on a guess is not a key the pager used.
type PrefetchPolicy interface {
	Prefetched(id int, size int64, now int64)
}

// inserted tells p that key id was loaded at time now: by a prefetch
// (Prefetched, where p is a PrefetchPolicy) or a demand's miss (Access).
// The cache and the simulator both insert through it.
func inserted(p Policy, id int, size, now int64, prefetch bool) {
	if pp, ok := p.(PrefetchPolicy); ok && prefetch {
		pp.Prefetched(id, size, now)
		return
	}
	p.Access(id, size, now, false)
}

// NewPolicy returns the policy called name: lru, lfu, cost (with a
// refetch cost of 1 per byte for every key), cycle or forecast (both
// AgingPolicies).
func NewPolicy(name string) (Policy, error) {
	switch name {
	case "lru":
		return &LRU{last: map[int]int64{}}, nil
	case "lfu":
		return NewLFU(), nil
	case "cost":
		return NewCostAware(nil), nil
	case "cycle":
		return NewCycle(), nil
	case "forecast":
		return NewForecast(), nil
	}
	return nil, fmt.Errorf("unknown policy %q (want lru, lfu, cost, cycle or forecast)", name)
}

// PolicyNames lists the policies NewPolicy knows.
var PolicyNames = []string{"lru", "lfu", "cost", "cycle", "forecast"}

// LRU evicts the entry used longest ago.
type LRU struct{ last map[int]int64 }

func (p *LRU) Name() string { return "lru" }
func (p *LRU) Access(id int, _ int64, now int64, _ bool) {
	p.last[id] = now
}
func (p *LRU) Remove(id int)        { delete(p.last, id) }
func (p *LRU) Score(id int) float64 { return float64(p.last[id]) }

// LFU evicts the entry used least often, counting uses with an
// exponential decay (half-life HalfLife accesses) so that yesterday's
// favourites age out; ties go to the least recently used. Counts survive
// eviction (a bounded ghost table), so a popular expert that was evicted
// comes back with its history.
type LFU struct {
	HalfLife float64
	count    map[int]float64 // decayed to time at[id]
	at       map[int]int64
	last     map[int]int64
}

// NewLFU returns an LFU with a half-life of 1<<16 accesses.
func NewLFU() *LFU {
	return &LFU{HalfLife: 1 << 16, count: map[int]float64{}, at: map[int]int64{}, last: map[int]int64{}}
}

func (p *LFU) Name() string { return "lfu" }

// decayed returns id's count as of now.
func (p *LFU) decayed(id int, now int64) float64 {
	c := p.count[id]
	if c == 0 {
		return 0
	}
	return c * math.Exp2(-float64(now-p.at[id])/p.HalfLife)
}

func (p *LFU) Access(id int, _ int64, now int64, _ bool) {
	p.count[id] = p.decayed(id, now) + 1
	p.at[id] = now
	p.last[id] = now
}

// Remove keeps the count (the ghost entry): the table holds one number
// per key ever seen, bounded by the model's experts.
func (p *LFU) Remove(id int) { delete(p.last, id) }

// Score is log2 of the count decayed to time 0: count x 2^(at/HalfLife),
// which orders entries as their decayed counts at any common time do, and
// does not change as time passes. Among equal counts the more recent wins.
func (p *LFU) Score(id int) float64 {
	return math.Log2(p.count[id]) + float64(p.at[id])/p.HalfLife
}

// CostAware is GreedyDual-Size-Frequency: an entry's value is
// L + frequency x cost / size, where cost is what refetching it from the
// level below costs and L rises to the value of each evicted entry, so
// that entries not used for a while age out. With equal sizes and costs
// it is a frequency policy with aging; with a slower level below for some
// keys (swarm against disk) it keeps those longer.
type CostAware struct {
	// Cost returns the refetch cost of id per byte (nil: 1 for all).
	Cost  func(id int) float64
	L     float64
	freq  map[int]float64
	value map[int]float64
}

// NewCostAware returns a GDSF policy with the given cost function.
func NewCostAware(cost func(id int) float64) *CostAware {
	return &CostAware{Cost: cost, freq: map[int]float64{}, value: map[int]float64{}}
}

func (p *CostAware) Name() string { return "cost" }

func (p *CostAware) Access(id int, size int64, _ int64, _ bool) {
	p.freq[id]++
	c := 1.0
	if p.Cost != nil {
		c = p.Cost(id)
	}
	// size is in units of 1 MiB so that values stay readable.
	p.value[id] = p.L + p.freq[id]*c/math.Max(float64(size)/(1<<20), 1e-6)
}

// Remove raises L to the evicted entry's value and keeps its frequency.
func (p *CostAware) Remove(id int) {
	if v, ok := p.value[id]; ok && v > p.L {
		p.L = v
	}
	delete(p.value, id)
}

func (p *CostAware) Score(id int) float64 { return p.value[id] }
