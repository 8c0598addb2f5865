package tiers

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
)

// The cycle policy's order on a hand-made history: stale entries first
// (fewest uses, then least recent), then the rest (fewest uses, then most
// recent), and never an entry the caller rules out.
func TestCycleOrder(t *testing.T) {
	p := NewCycle()
	now := int64(0)
	use := func(ids ...int) {
		for _, id := range ids {
			p.Access(id, 1, now, true)
			now++
		}
	}
	use(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3) // t 0-11: a cycle of 4
	use(4, 0, 1)                            // t 12-14: key 4 once; 0 and 1 a cycle late
	if c, s := p.Cycle(); c != 4 || s != 5 {
		t.Fatalf("cycle %d, stale past %d; want 4 and 5", c, s)
	}
	// Uses: 0 and 1 four, 2 and 3 three, 4 one. Last use: 0 at 13, 1 at
	// 14, 2 at 10, 3 at 11, 4 at 12.
	for _, tc := range []struct {
		now  int64
		out  []int // not evictable
		want int   // -1: none
	}{
		{16, nil, 2},               // 2 is stale (age 6)
		{16, []int{2}, 4},          // the rest by uses: 4 has one
		{16, []int{2, 4}, 3},       // 3 has three
		{16, []int{2, 3, 4}, 1},    // 0 and 1 have four: the most recent, 1
		{16, []int{1, 2, 3, 4}, 0}, //
		{16, []int{0, 1, 2, 3, 4}, -1},
		{17, nil, 2},      // 2 and 3 stale, three uses each: the least recent
		{17, []int{2}, 3}, // 3 stale (age 6) before 4 (age 5, one use)
		{18, nil, 4},      // 4 stale too, with fewer uses than 2
		{18, []int{4}, 2}, //
	} {
		out := map[int]bool{}
		for _, id := range tc.out {
			out[id] = true
		}
		asked := map[int]int{}
		got, ok := p.Victim(tc.now, func(id int) bool { asked[id]++; return !out[id] })
		if !ok {
			got = -1
		}
		if got != tc.want {
			t.Errorf("at %d without %v: victim %d; want %d", tc.now, tc.out, got, tc.want)
		}
		for id, n := range asked {
			if n > 1 {
				t.Errorf("at %d: asked about %d %d times", tc.now, id, n)
			}
		}
	}
	p.Remove(2)
	if got, _ := p.Victim(17, func(int) bool { return true }); got != 3 {
		t.Errorf("after removing 2: victim %d; want 3", got)
	}
	held := 0
	for _, k := range p.keys {
		if k.held {
			held++
		}
	}
	if len(p.keys) != 5 || held != 4 {
		t.Errorf("%d key records, %d held; want 5 and 4", len(p.keys), held)
	}
}

// cyclic returns a trace of rounds passes over n keys in order.
func cyclic(n, rounds int) *Trace {
	tr := &Trace{}
	for i := 0; i < n; i++ {
		tr.Keys = append(tr.Keys, TraceKey{1, "k", -1})
	}
	for r := 0; r < rounds; r++ {
		for i := 0; i < n; i++ {
			tr.Accesses = append(tr.Accesses, Access{Token: r, Key: i})
		}
	}
	return tr
}

// On a pure cycle larger than the cache LRU never hits (it evicts what
// comes next); the cycle policy keeps most of what it can.
func TestCycleBeatsLRUOnACycle(t *testing.T) {
	tr := cyclic(10, 200)
	b := Belady(tr, 6)
	lru := Simulate(tr, mustPolicy("lru"), 6)
	cyc := Simulate(tr, mustPolicy("cycle"), 6)
	if lru.Hits != 0 {
		t.Fatalf("lru hit %d times on a cycle; want 0", lru.Hits)
	}
	if cyc.HitRate < 0.8*b.HitRate {
		t.Fatalf("cycle hit rate %.3f; want at least 0.8 of Belady's %.3f", cyc.HitRate, b.HitRate)
	}
}

// On the Mixtral-shaped synthetic trace, at 10% and 50% of the experts,
// the cycle policy hits more often than the policies that do not know the
// walk (lru, lfu, cost; forecast has tests of its own).
func TestCycleOnMixtralShape(t *testing.T) {
	tr, err := SyntheticMoETrace(DefaultMoETrace)
	if err != nil {
		t.Fatal(err)
	}
	rs := Report(tr, []float64{0.1, 0.5})
	for i := 0; i < len(rs); i += 1 + len(PolicyNames) {
		var cyc SimResult
		for _, r := range rs[i+1 : i+1+len(PolicyNames)] {
			if r.Policy == "cycle" {
				cyc = r
			}
		}
		for _, r := range rs[i+1 : i+1+len(PolicyNames)] {
			if r.Policy != "cycle" && r.Policy != "forecast" && r.HitRate >= cyc.HitRate {
				var buf bytes.Buffer
				PrintReport(&buf, tr, rs)
				t.Fatalf("%s hits %.3f >= cycle's %.3f\n%s", r.Policy, r.HitRate, cyc.HitRate, buf.String())
			}
		}
	}
}

// The cache under the cycle policy evicts what the simulator does: a
// replay of its trace counts the same hits, misses and evictions.
func TestCycleCacheAgreesWithSimulate(t *testing.T) {
	w := newWorld(t, 6)
	rec := &TraceRecorder{}
	c, err := New(Config{RAM: 4 * keyLen, Disk: DiskSource{w.st}, Trace: rec, Now: fakeNow(), Policy: "cycle"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	order := []int{0, 1, 2, 3, 4, 5}
	for tok := 0; tok < 12; tok++ {
		rec.SetToken(tok)
		if tok%3 == 2 { // now and then the router picks another expert
			order[1], order[4] = order[4], order[1]
		}
		for _, i := range order {
			l, err := c.Get(context.Background(), w.keys[i], RAM)
			if err != nil {
				t.Fatal(err)
			}
			l.Release()
		}
	}
	sim := Simulate(rec.Trace(), mustPolicy("cycle"), 4*keyLen)
	got := c.Stats()[RAM]
	if sim.Hits != int(got.Hits) || sim.Misses != int(got.Misses) || sim.Evictions != int(got.Evictions) {
		t.Fatalf("replay: %d hits %d misses %d evictions; the cache counted %d, %d and %d",
			sim.Hits, sim.Misses, sim.Evictions, got.Hits, got.Misses, got.Evictions)
	}
	if sim.Hits == 0 {
		t.Fatal("no hits: the test does not exercise the order")
	}
}

// The buckets pick the victim a scan of every held entry under the
// policy's order picks (victimByScan, the rule as written), through random
// accesses, removals, ages and entries ruled out, and ask evictable at
// most once per entry.
func TestCycleVictimMatchesScan(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 9))
		p := NewCycle()
		nkeys := 2 + r.IntN(60)
		now := int64(0)
		for step := 0; step < 3000; step++ {
			switch op := r.IntN(10); {
			case op < 6:
				p.Access(r.IntN(nkeys), 1, now, true)
				if r.IntN(4) > 0 { // some accesses share a time
					now++
				}
			case op < 7:
				p.Remove(r.IntN(nkeys))
			default:
				at := now + int64(r.IntN(3*nkeys))
				out := map[int]bool{}
				for range r.IntN(nkeys) {
					out[r.IntN(nkeys)] = true
				}
				asked := map[int]int{}
				got, ok := p.Victim(at, func(id int) bool { asked[id]++; return !out[id] })
				want, wok := victimByScan(p, at, func(id int) bool { return !out[id] })
				if got != want || ok != wok {
					t.Fatalf("seed %d step %d at %d: victim %d (%v); the scan picks %d (%v)", seed, step, at, got, ok, want, wok)
				}
				for id, n := range asked {
					if n > 1 || !p.keys[id].held {
						t.Fatalf("seed %d step %d: asked about %d %d times (held %v)", seed, step, id, n, p.keys[id].held)
					}
				}
			}
		}
	}
}

// victimByScan is Cycle's rule as a scan of every held entry: the lowest
// under before among the evictable ones.
func victimByScan(p *Cycle, now int64, evictable func(id int) bool) (int, bool) {
	best, bestStale := -1, false
	for id := range p.keys {
		if !p.keys[id].held || !evictable(id) {
			continue
		}
		stale := p.stale > 0 && now-p.keys[id].last > p.stale
		if best < 0 || p.before(id, stale, best, bestStale) {
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
