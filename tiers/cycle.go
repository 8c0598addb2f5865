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
//
// The entries held are kept in buckets by use count (the counts of the
// non-empty buckets in a sorted slice), each bucket a list ordered by last
// use, so that a victim is found at a bucket's head (stale) or tail (not
// stale) instead of by a scan of the level: on the DeepSeek-V3-shaped
// trace at 7424 entries held, 42 us an eviction by scan (tiers/BENCHMARKS.md).
type Cycle struct {
	keys    []cycleKey             // by id
	buckets map[int64]*cycleBucket // by use count
	order   []int64                // the use counts of the buckets, ascending
	gaps    [CycleWindow]int64
	ngaps   int   // gaps seen (the window holds the last CycleWindow)
	cycle   int64 // C; 0 before any reuse
	stale   int64 // an entry unused for longer is stale
	sorted  []int64
}

// CycleWindow is how many of the latest reuse gaps the cycle is measured on.
const CycleWindow = 512

type cycleKey struct {
	held       bool
	last       int64 // time of the last access
	uses       int64
	prev, next int32 // neighbours in its bucket, by (last, id); -1: none
}

// cycleBucket is the list of the held entries with one use count, from the
// least recently used to the most (equal times: by id).
type cycleBucket struct{ head, tail int32 }

// NewCycle returns a Cycle policy.
func NewCycle() *Cycle { return &Cycle{buckets: map[int64]*cycleBucket{}} }

func (p *Cycle) Name() string { return "cycle" }

func (p *Cycle) key(id int) *cycleKey {
	for id >= len(p.keys) {
		p.keys = append(p.keys, cycleKey{prev: -1, next: -1})
	}
	return &p.keys[id]
}

func (p *Cycle) Access(id int, _ int64, now int64, _ bool) {
	k := p.key(id)
	if k.uses > 0 { // seen before
		p.gap(now - k.last)
	}
	if k.held {
		p.unlink(id)
	}
	k.held = true
	k.last = now
	k.uses++
	p.link(id)
}

// link puts held entry id into the bucket of its use count, in order.
func (p *Cycle) link(id int) {
	k := &p.keys[id]
	b := p.buckets[k.uses]
	if b == nil {
		b = &cycleBucket{head: -1, tail: -1}
		p.buckets[k.uses] = b
		i, _ := slices.BinarySearch(p.order, k.uses)
		p.order = slices.Insert(p.order, i, k.uses)
	}
	// After the last entry that goes first: accesses come in time order,
	// so this is the tail but for entries used at the same time.
	after := b.tail
	for after >= 0 && !p.listedBefore(int(after), id) {
		after = p.keys[after].prev
	}
	k.prev = after
	if after < 0 {
		k.next = b.head
		b.head = int32(id)
	} else {
		k.next = p.keys[after].next
		p.keys[after].next = int32(id)
	}
	if k.next < 0 {
		b.tail = int32(id)
	} else {
		p.keys[k.next].prev = int32(id)
	}
}

// listedBefore reports whether a comes before b in a bucket's list.
func (p *Cycle) listedBefore(a, b int) bool {
	ka, kb := &p.keys[a], &p.keys[b]
	return ka.last < kb.last || (ka.last == kb.last && a < b)
}

// unlink takes held entry id out of its bucket (dropping the bucket when
// it empties).
func (p *Cycle) unlink(id int) {
	k := &p.keys[id]
	b := p.buckets[k.uses]
	if k.prev < 0 {
		b.head = k.next
	} else {
		p.keys[k.prev].next = k.next
	}
	if k.next < 0 {
		b.tail = k.prev
	} else {
		p.keys[k.next].prev = k.prev
	}
	k.prev, k.next = -1, -1
	if b.head < 0 {
		delete(p.buckets, k.uses)
		i, _ := slices.BinarySearch(p.order, k.uses)
		p.order = slices.Delete(p.order, i, i+1)
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
	if id >= len(p.keys) || !p.keys[id].held {
		return
	}
	p.unlink(id)
	p.keys[id].held = false
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

// Victim walks the buckets from the fewest uses up: first each bucket's
// stale entries from its head (the least recently used), then, if none of
// those may go, each bucket's entries from its tail (the most recently
// used; among equal times the lowest id first). It asks evictable once
// per entry it passes, and passes only entries that rank before the one
// it returns.
func (p *Cycle) Victim(now int64, evictable func(id int) bool) (int, bool) {
	cut := now - p.stale // stale: last use before cut
	isStale := func(id int32) bool { return p.stale > 0 && p.keys[id].last < cut }
	if p.stale > 0 {
		for _, u := range p.order {
			for id := p.buckets[u].head; id >= 0 && isStale(id); id = p.keys[id].next {
				if evictable(int(id)) {
					return int(id), true
				}
			}
		}
	}
	for _, u := range p.order {
		for id := p.buckets[u].tail; id >= 0 && !isStale(id); {
			// The entries used at the same time as id, lowest id first.
			first := id
			for q := p.keys[first].prev; q >= 0 && p.keys[q].last == p.keys[id].last; q = p.keys[q].prev {
				first = q
			}
			for q := first; ; q = p.keys[q].next {
				if evictable(int(q)) {
					return int(q), true
				}
				if q == id {
					break
				}
			}
			id = p.keys[first].prev
		}
	}
	return -1, false
}
