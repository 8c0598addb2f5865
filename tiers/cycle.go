package tiers

import "slices"

// An AgingPolicy is a Policy whose order changes as time passes, not only
// at accesses (an entry's age decides it), so that no heap of fixed scores
// can hold it: the cache and the simulator ask it for each victim instead,
// and ignore Score.
type AgingPolicy interface {
	Policy
	// Victim returns the entry to evict at time now: the one the policy
	// ranks lowest among the entries it holds (accessed and not removed)
	// for which evictable is true, or false if there is none. It calls
	// evictable at most once per entry it holds, so a victim costs a scan
	// of the level (a VRAM level holds a few thousand entries at most).
	// Called under the cache's lock; deterministic.
	Victim(now int64, evictable func(id int) bool) (id int, ok bool)
}

// Cycle is an eviction policy for a pager that walks a model's layers in
// order once per token, so that an expert's matrices are used again, if
// at all, about one cycle (one token's accesses) later, or a whole number
// of cycles later. It learns the cycle from the reuse gaps it sees and
// calls an entry stale once it has gone unused for longer than a one-cycle
// gap: its layer has come round and chosen other experts. It evicts a
// stale entry first, the least used (ties: the least recently used); with
// none stale, the least used of the rest, and among those the most
// recently used: under a cycle the most recent use is the one whose next
// use is farthest away (Belady's choice), where LRU evicts what the next
// layers are about to reuse.
//
// The cycle is measured, not configured: C is the 10th percentile of the
// last CycleWindow reuse gaps (gaps cluster at whole numbers of cycles,
// and each key is used at most once a cycle, so few gaps are shorter), and
// an entry is stale past the 90th percentile of the gaps between C and
// 1.5 C (the spread of a one-cycle gap: the order of experts within a
// layer varies, and prefetch requests shift it). Before any reuse it
// knows no cycle and ranks every entry as not stale.
//
// Use counts are kept for every key ever seen (one record per key of the
// model, like LFU's), and the gap window is bounded.
type Cycle struct {
	keys   []cycleKey // by id
	held   []int      // the entries held, in no order
	gaps   [CycleWindow]int64
	ngaps  int   // gaps seen (the window holds the last CycleWindow)
	cycle  int64 // C; 0 before any reuse
	stale  int64 // an entry unused for longer is stale
	sorted []int64
}

// CycleWindow is how many of the latest reuse gaps the cycle is measured on.
const CycleWindow = 512

type cycleKey struct {
	seen bool
	last int64 // time of the last access
	uses int64
	pos  int // index in held; -1 when not held
}

// NewCycle returns a Cycle policy.
func NewCycle() *Cycle { return &Cycle{} }

func (p *Cycle) Name() string { return "cycle" }

func (p *Cycle) key(id int) *cycleKey {
	for id >= len(p.keys) {
		p.keys = append(p.keys, cycleKey{pos: -1})
	}
	return &p.keys[id]
}

func (p *Cycle) Access(id int, _ int64, now int64, _ bool) {
	k := p.key(id)
	if k.seen {
		p.gap(now - k.last)
	}
	k.seen = true
	k.last = now
	k.uses++
	if k.pos < 0 {
		k.pos = len(p.held)
		p.held = append(p.held, id)
	}
}

// gap records a reuse gap and, every 64 gaps (every gap while the window
// is filling), measures the cycle again.
func (p *Cycle) gap(g int64) {
	p.gaps[p.ngaps%CycleWindow] = g
	p.ngaps++
	n := min(p.ngaps, CycleWindow)
	if p.ngaps%64 != 0 && p.ngaps > 64 {
		return
	}
	p.sorted = append(p.sorted[:0], p.gaps[:n]...)
	slices.Sort(p.sorted)
	lo := n / 10
	p.cycle = p.sorted[lo]
	hi := lo
	for hi < n && 2*p.sorted[hi] < 3*p.cycle {
		hi++
	}
	one := p.sorted[lo:hi] // the one-cycle gaps
	if len(one) == 0 {
		p.stale = p.cycle
		return
	}
	p.stale = one[(len(one)-1)*9/10]
}

// Remove forgets that id is held and keeps its record (the ghost entry).
func (p *Cycle) Remove(id int) {
	if id >= len(p.keys) || p.keys[id].pos < 0 {
		return
	}
	i := p.keys[id].pos
	last := p.held[len(p.held)-1]
	p.held[i] = last
	p.keys[last].pos = i
	p.held = p.held[:len(p.held)-1]
	p.keys[id].pos = -1
}

// Score is the time of id's last access; the cache and the simulator
// use Victim instead.
func (p *Cycle) Score(id int) float64 {
	if id >= len(p.keys) {
		return 0
	}
	return float64(p.keys[id].last)
}

// Cycle returns the cycle and the staleness limit as now measured (0, 0
// before any reuse), in accesses.
func (p *Cycle) Cycle() (cycle, stale int64) { return p.cycle, p.stale }

// Victim ranks first and asks evictable only of an entry that would beat
// the best so far: the ranking is a few comparisons of the entry's own
// record, evictable a lookup in the cache's map, and few entries beat the
// best in a scan.
func (p *Cycle) Victim(now int64, evictable func(id int) bool) (int, bool) {
	best, bestStale := -1, false
	for _, id := range p.held {
		stale := p.stale > 0 && now-p.keys[id].last > p.stale
		if best >= 0 && !p.before(id, stale, best, bestStale) {
			continue
		}
		if evictable(id) {
			best, bestStale = id, stale
		}
	}
	return best, best >= 0
}

// before reports whether a (stale or not) is evicted before b.
func (p *Cycle) before(a int, aStale bool, b int, bStale bool) bool {
	if aStale != bStale {
		return aStale
	}
	ka, kb := &p.keys[a], &p.keys[b]
	if ka.uses != kb.uses {
		return ka.uses < kb.uses
	}
	if ka.last != kb.last {
		// Stale: the least recently used; not stale: the most.
		return (ka.last < kb.last) == aStale
	}
	return a < b
}
