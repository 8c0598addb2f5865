package tiers

import (
	"container/heap"
	"fmt"
	"io"
	"math"
)

// evictHeap orders entries by score, lowest first; an entry whose score
// changed is pushed again, and stale items are skipped when popped.
type evictHeap struct {
	items []heapItem
}

type heapItem struct {
	score float64
	id    int
	ver   uint64
}

func (h *evictHeap) Len() int           { return len(h.items) }
func (h *evictHeap) Less(i, j int) bool { return h.items[i].score < h.items[j].score }
func (h *evictHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *evictHeap) Push(x any)         { h.items = append(h.items, x.(heapItem)) }
func (h *evictHeap) Pop() any {
	it := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return it
}

// SimResult is a policy's replay of a trace at one budget.
type SimResult struct {
	Policy     string  `json:"policy"`
	Budget     int64   `json:"budget"`
	Hits       int     `json:"hits"`
	Misses     int     `json:"misses"`
	HitRate    float64 `json:"hitRate"`
	MissBytes  int64   `json:"missBytes"`
	ToBelady   float64 `json:"ofBelady,omitempty"` // hit rate / Belady's at the same budget
	Evictions  int     `json:"evictions"`
	Prefetches int     `json:"prefetches,omitempty"` // prefetch requests that loaded their key
	Skipped    string  `json:"skipped,omitempty"`    // why the policy was not replayed
}

// MaxForecastWork bounds the work of a trace that Report replays under
// forecast: the keys times the steps (it learns over every key seen at
// each step's end) and the accesses times the keys of the largest group
// (a victim refreshes a group an access changed). A trace from a file
// could otherwise ask for hours in a few megabytes (100 tokens of
// DeepSeek-V3's 44544 expert matrices are ~2^22 and ~2^27).
const MaxForecastWork = 1 << 31

var maxForecastWork int64 = MaxForecastWork // a variable for TestReportBoundsForecast

// steps counts t's steps (changes of Access.Token).
func (t *Trace) steps() int64 {
	var n int64
	prev := -1
	for _, a := range t.Accesses {
		if a.Token != prev {
			n++
			prev = a.Token
		}
	}
	return n
}

// Loads is how many keys the replay loaded: misses and prefetches.
func (r SimResult) Loads() int { return r.Misses + r.Prefetches }

// Simulate replays t's accesses against policy p with budget bytes of
// cache. Demand accesses count as hits or misses; prefetch requests
// insert their key without counting. An AgingPolicy picks each victim
// itself, as in the cache.
func Simulate(t *Trace, p Policy, budget int64) SimResult {
	res := SimResult{Policy: p.Name(), Budget: budget}
	in := make([]bool, len(t.Keys))
	ver := make([]uint64, len(t.Keys))
	var used int64
	var h evictHeap
	aging, _ := p.(AgingPolicy)
	push := func(id int) {
		if aging != nil {
			return
		}
		ver[id]++
		heap.Push(&h, heapItem{p.Score(id), id, ver[id]})
	}
	isIn := func(id int) bool { return in[id] }
	if gp, ok := p.(GroupPolicy); ok {
		for id, k := range t.Keys {
			if k.Group >= 0 {
				gp.SetGroup(id, k.Group)
			}
		}
	}
	sp, _ := p.(StepPolicy)
	step := -1
	for now, a := range t.Accesses {
		if sp != nil && a.Token != step {
			// A step begins: with its token where the trace has one.
			step = a.Token
			tok, ok := t.Tokens[step]
			if !ok {
				tok = -1
			}
			sp.BeginStep(tok)
		}
		k := t.Keys[a.Key]
		if in[a.Key] {
			if !a.Prefetch {
				res.Hits++
				p.Access(a.Key, k.Size, int64(now), true)
				push(a.Key)
			}
			continue
		}
		if !a.Prefetch {
			res.Misses++
			res.MissBytes += k.Size
		} else {
			res.Prefetches++
		}
		if k.Size > budget {
			continue // never fits: served from below each time
		}
		for used+k.Size > budget {
			var id int
			if aging != nil {
				id, _ = aging.Victim(int64(now), isIn) // something is in: used > 0
			} else {
				it := heap.Pop(&h).(heapItem)
				if !in[it.id] || it.ver != ver[it.id] {
					continue
				}
				id = it.id
			}
			in[id] = false
			used -= t.Keys[id].Size
			p.Remove(id)
			res.Evictions++
		}
		in[a.Key] = true
		used += k.Size
		inserted(p, a.Key, k.Size, int64(now), a.Prefetch)
		push(a.Key)
	}
	if n := res.Hits + res.Misses; n > 0 {
		res.HitRate = float64(res.Hits) / float64(n)
	}
	return res
}

// Belady replays t's demand accesses with Belady's MIN: on a miss with the
// cache full, evict the entry whose next use is farthest away. For keys of
// one size (the experts of one model) no policy can hit more often at the
// same budget. Prefetch requests are ignored.
func Belady(t *Trace, budget int64) SimResult {
	res := SimResult{Policy: "belady", Budget: budget}
	var demand []Access
	for _, a := range t.Accesses {
		if !a.Prefetch {
			demand = append(demand, a)
		}
	}
	next := make([]int, len(demand))
	last := make(map[int]int, len(t.Keys))
	for i := len(demand) - 1; i >= 0; i-- {
		if j, ok := last[demand[i].Key]; ok {
			next[i] = j
		} else {
			next[i] = math.MaxInt
		}
		last[demand[i].Key] = i
	}
	in := make([]bool, len(t.Keys))
	nextUse := make([]int, len(t.Keys))
	var used int64
	var h evictHeap // by -next use: the farthest first
	for i, a := range demand {
		k := t.Keys[a.Key]
		if in[a.Key] {
			res.Hits++
		} else {
			res.Misses++
			res.MissBytes += k.Size
			if k.Size > budget {
				continue
			}
			for used+k.Size > budget {
				it := heap.Pop(&h).(heapItem)
				if !in[it.id] || uint64(nextUse[it.id]) != it.ver {
					continue
				}
				in[it.id] = false
				used -= t.Keys[it.id].Size
				res.Evictions++
			}
			in[a.Key] = true
			used += k.Size
		}
		nextUse[a.Key] = next[i]
		heap.Push(&h, heapItem{score: -float64(next[i]), id: a.Key, ver: uint64(next[i])})
	}
	if n := res.Hits + res.Misses; n > 0 {
		res.HitRate = float64(res.Hits) / float64(n)
	}
	return res
}

// DemandOnly returns t without its prefetch records: what eviction
// policies and Belady's MIN are compared on (MIN ignores prefetches, so a
// policy replayed with them would be credited for the prefetcher's work).
func (t *Trace) DemandOnly() *Trace {
	out := &Trace{Keys: t.Keys, Tokens: t.Tokens}
	for _, a := range t.Accesses {
		if !a.Prefetch {
			out.Accesses = append(out.Accesses, a)
		}
	}
	return out
}

// Report replays t's demands against every policy and Belady's MIN at
// each budget (a fraction of all keys' bytes).
func Report(t *Trace, fractions []float64) []SimResult {
	d := t.DemandOnly()
	return report(d, d, fractions)
}

// ReportWithPrefetches is Report with the policies replaying t's prefetch
// requests too, as the cache met them: what a recorded run's loads
// (misses and prefetches, SimResult.Loads) would have been under each
// policy. Belady's MIN still sees the demands only.
func ReportWithPrefetches(t *Trace, fractions []float64) []SimResult {
	return report(t, t.DemandOnly(), fractions)
}

// PrefetchesTo returns t with only the prefetch records that promoted to
// level (or do not say where): a recorded run's own prefetches into the
// level its demands are counted at, for ReportWithPrefetches. The GPU
// pager's demands are at VRAM; its prefetches go to RAM but for the sure
// ones (experts.GPUModel.PrefetchSure).
func (t *Trace) PrefetchesTo(level Level) *Trace {
	to := traceLevel(level)
	out := &Trace{Keys: t.Keys, Tokens: t.Tokens}
	for _, a := range t.Accesses {
		if !a.Prefetch || a.To == TraceAny || a.To == to {
			out.Accesses = append(out.Accesses, a)
		}
	}
	return out
}

func report(t, demands *Trace, fractions []float64) []SimResult {
	total := t.Bytes()
	var out []SimResult
	// Learning over every key at each step's end, and a victim's refresh
	// of a group changed since the last: the keys times the steps, and
	// the accesses times the largest group.
	pop := map[int]int64{}
	var largest int64
	for _, k := range t.Keys {
		if k.Group >= 0 {
			pop[k.Group]++
			largest = max(largest, pop[k.Group])
		}
	}
	work := max(int64(len(t.Keys))*t.steps(), int64(len(t.Accesses))*largest)
	for _, f := range fractions {
		budget := int64(f * float64(total))
		b := Belady(demands, budget)
		out = append(out, b)
		for _, name := range PolicyNames {
			if name == "forecast" && work > maxForecastWork {
				out = append(out, SimResult{Policy: name, Budget: budget, Skipped: fmt.Sprintf("%d keys x %d steps, or %d accesses x a group of %d keys, is more than %d", len(t.Keys), t.steps(), len(t.Accesses), largest, maxForecastWork)})
				continue
			}
			p, _ := NewPolicy(name)
			r := Simulate(t, p, budget)
			if b.HitRate > 0 {
				r.ToBelady = r.HitRate / b.HitRate
			}
			out = append(out, r)
		}
	}
	return out
}

// PrintReport writes a report as a table.
func PrintReport(w io.Writer, t *Trace, rs []SimResult) {
	total := t.Bytes()
	fmt.Fprintf(w, "%-8s %8s %8s %9s %9s %9s\n", "budget", "policy", "hit rate", "of MIN", "evictions", "loads")
	for _, r := range rs {
		if r.Skipped != "" {
			fmt.Fprintf(w, "%7.0f%% %8s not replayed: %s\n", 100*float64(r.Budget)/float64(total), r.Policy, r.Skipped)
			continue
		}
		of := "-"
		if r.Policy != "belady" {
			of = fmt.Sprintf("%.3f", r.ToBelady)
		}
		fmt.Fprintf(w, "%7.0f%% %8s %8.3f %9s %9d %9d\n", 100*float64(r.Budget)/float64(total), r.Policy, r.HitRate, of, r.Evictions, r.Loads())
	}
}
