package tiers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

const keyLen = 64 << 10

// world is a store holding one random blob, and keys over it.
type world struct {
	st   *cas.Store
	blob cas.CID
	data []byte
	keys []Key
}

func newWorld(t testing.TB, nkeys int) *world {
	t.Helper()
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	data := make([]byte, nkeys*keyLen+1000) // not a whole number of groups
	r := rand.New(rand.NewPCG(1, 1))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	info, err := st.Put(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	w := &world{st: st, blob: info.CID, data: data}
	for i := 0; i < nkeys; i++ {
		off := int64(i * keyLen)
		if i == nkeys-1 {
			off += 1000 - 7 // a range that starts and ends inside groups
		}
		w.keys = append(w.keys, Key{Blob: info.CID, Size: int64(len(data)), Off: off, Len: keyLen})
	}
	return w
}

func (w *world) want(k Key) []byte { return w.data[k.Off : k.Off+k.Len] }

// storeFetcher is a fake swarm: it serves slices from a store, optionally
// corrupting them, counting and optionally gating its reads.
type storeFetcher struct {
	st      *cas.Store
	reads   atomic.Int64
	corrupt atomic.Bool
	gate    chan struct{} // if not nil, each read waits for a value or ctx
}

func (f *storeFetcher) FetchSlice(ctx context.Context, c cas.CID, size, off, n int64) ([]byte, error) {
	f.reads.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	s, err := f.st.AppendSlice(nil, c, off, n)
	if err == nil && f.corrupt.Load() {
		s[len(s)/2] ^= 0x40
	}
	return s, err
}

// memArena is a VRAM arena in memory, with host blocks (a HostArena).
type memArena struct {
	mu         sync.Mutex
	slots      [][]byte
	size       int64
	blocks     int // live host blocks
	hostCopies int // UploadHost calls
}

func newMemArena(n int, size int64) *memArena {
	a := &memArena{size: size}
	for range n {
		a.slots = append(a.slots, make([]byte, size))
	}
	return a
}
func (a *memArena) Slots() int      { return len(a.slots) }
func (a *memArena) SlotSize() int64 { return a.size }
func (a *memArena) Upload(_ context.Context, s int, data []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	copy(a.slots[s], data)
	return nil
}
func (a *memArena) AllocHost(n int64) (HostBlock, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.blocks++
	return &memBlock{a: a, buf: make([]byte, n)}, nil
}
func (a *memArena) UploadHost(_ context.Context, s int, b HostBlock) error {
	m := b.(*memBlock)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.sealed || m.released {
		return fmt.Errorf("upload from a host block: sealed %v, released %v", m.sealed, m.released)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.hostCopies++
	copy(a.slots[s], m.buf)
	return nil
}
func (a *memArena) counts() (blocks, hostCopies int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.blocks, a.hostCopies
}

// memBlock is a host block of a memArena: it refuses writes once sealed
// and everything once released.
type memBlock struct {
	mu               sync.Mutex
	a                *memArena
	buf              []byte
	sealed, released bool
}

func (m *memBlock) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sealed || m.released {
		return nil
	}
	return m.buf
}
func (m *memBlock) Seal() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.released {
		return errors.New("seal of a released block")
	}
	m.sealed = true
	return nil
}
func (m *memBlock) Release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.released {
		m.released = true
		m.a.mu.Lock()
		m.a.blocks--
		m.a.mu.Unlock()
	}
}

func (a *memArena) read(s int, n int64) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return bytes.Clone(a.slots[s][:n])
}

// fakeNow is a clock that moves 1 ms per call: latencies are exact.
func fakeNow() func() time.Time {
	var n atomic.Int64
	return func() time.Time { return time.Unix(0, n.Add(int64(time.Millisecond))) }
}

// levelCase is one level under the conformance suite.
type levelCase struct {
	name   string
	target Level
	source string // disk or swarm
	host   bool   // Config.HostRAM (with a HostArena)
	policy string // Config.Policy (default lru)
}

// withPolicies returns each case under each policy of PolicyNames.
func withPolicies(cases []levelCase) []levelCase {
	var out []levelCase
	for _, lc := range cases {
		for _, p := range PolicyNames {
			lc.policy = p
			out = append(out, lc)
		}
	}
	return out
}

func (lc levelCase) policyName() string {
	if lc.policy == "" {
		return "lru"
	}
	return lc.policy
}

var conformance = []levelCase{
	{"ram from disk", RAM, "disk", false, ""},
	{"ram from swarm", RAM, "swarm", false, ""},
	{"vram from disk", VRAM, "disk", false, ""},
	{"vram from swarm", VRAM, "swarm", false, ""},
}

func (lc levelCase) cache(t testing.TB, w *world, slots int, arena Arena) (*Cache, *storeFetcher) {
	t.Helper()
	f := &storeFetcher{st: w.st}
	cfg := Config{RAM: int64(slots) * keyLen, Now: fakeNow(), Policy: lc.policyName()}
	if lc.source == "disk" {
		cfg.Disk = DiskSource{w.st}
	} else {
		cfg.Swarm = SwarmSource{f}
	}
	if lc.target == VRAM {
		if arena == nil {
			arena = newMemArena(slots, keyLen)
		}
		cfg.Arena = arena
		cfg.HostRAM = lc.host
		cfg.RAM = keyLen // RAM smaller than VRAM: VRAM holds what RAM evicted
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, f
}

// leaseBytes returns what a lease holds, wherever it is.
func leaseBytes(l *Lease, arena *memArena) []byte {
	if l.Level == VRAM {
		return arena.read(l.Slot(), l.Key.Len)
	}
	return l.Bytes()
}

// The conformance suite: every level serves the right bytes, keeps its
// budget through evictions, and never evicts a lease.
func TestConformance(t *testing.T) {
	for _, lc := range withPolicies(conformance) {
		t.Run(lc.name+"/"+lc.policy, func(t *testing.T) {
			w := newWorld(t, 8)
			arena := newMemArena(3, keyLen)
			c, _ := lc.cache(t, w, 3, arena)
			ctx := context.Background()
			// Every key, twice, through a budget of 3: evictions happen.
			for round := 0; round < 2; round++ {
				for _, k := range w.keys {
					l, err := c.Get(ctx, k, lc.target)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(leaseBytes(l, arena), w.want(k)) {
						t.Fatalf("%v: wrong bytes", k)
					}
					l.Release()
					if err := c.check(); err != nil {
						t.Fatal(err)
					}
				}
			}
			// Leases pin: hold 3, a 4th cannot get room.
			var held []*Lease
			for _, k := range w.keys[:3] {
				l, err := c.Get(ctx, k, lc.target)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
			}
			if _, err := c.Get(ctx, w.keys[5], lc.target); !errors.Is(err, ErrFull) {
				t.Fatalf("a 4th key with 3 leased: %v; want ErrFull", err)
			}
			held[1].Release()
			l, err := c.Get(ctx, w.keys[5], lc.target)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range []*Lease{held[0], held[2]} {
				if !c.Has(h.Key, lc.target) || !bytes.Equal(leaseBytes(h, arena), w.want(h.Key)) {
					t.Fatalf("leased %v was evicted", h.Key)
				}
			}
			if c.Has(held[1].Key, lc.target) {
				t.Fatal("the released key was not the one evicted")
			}
			l.Release()
			st := c.Stats()[lc.target]
			if st.Hits+st.Misses == 0 || st.Evictions == 0 || st.Used > st.Budget {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Concurrent gets of one key share one read (and one upload).
func TestConcurrentGetsShareOneLoad(t *testing.T) {
	for _, lc := range conformance {
		if lc.source != "swarm" {
			continue
		}
		t.Run(lc.name, func(t *testing.T) {
			w := newWorld(t, 4)
			c, f := lc.cache(t, w, 2, nil)
			f.gate = make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 10)
			var loaded atomic.Int32 // leases that say they loaded the key
			for range 10 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l, err := c.Get(context.Background(), w.keys[0], lc.target)
					if err == nil {
						if l.Loaded {
							loaded.Add(1)
						}
						l.Release()
					}
					errs <- err
				}()
			}
			time.Sleep(50 * time.Millisecond) // let them all queue on the one load
			close(f.gate)
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if n := f.reads.Load(); n != 1 {
				t.Fatalf("%d swarm reads for 10 concurrent gets; want 1", n)
			}
			if n := loaded.Load(); n != 1 {
				t.Fatalf("%d of 10 leases say they loaded the key; want the one Get that did", n)
			}
			l, err := c.Get(context.Background(), w.keys[0], lc.target)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			if l.Loaded {
				t.Fatal("a Get that found the key says it loaded it")
			}
		})
	}
}

// Bytes that fail verification are never served, and the level that sent
// them is named.
func TestCorruptSwarmBytesNeverServed(t *testing.T) {
	for _, lc := range conformance {
		if lc.source != "swarm" {
			continue
		}
		t.Run(lc.name, func(t *testing.T) {
			w := newWorld(t, 4)
			c, f := lc.cache(t, w, 2, nil)
			f.corrupt.Store(true)
			_, err := c.Get(context.Background(), w.keys[1], lc.target)
			var se *SourceError
			if !errors.As(err, &se) || se.Level != Swarm || !errors.Is(err, cas.ErrCorrupt) {
				t.Fatalf("Get of corrupt bytes: %v; want a SourceError from the swarm wrapping ErrCorrupt", err)
			}
			if c.Has(w.keys[1], lc.target) || c.Has(w.keys[1], RAM) {
				t.Fatal("corrupt bytes were cached")
			}
			if s := c.Stats()[Swarm]; s.Corrupt != 1 {
				t.Fatalf("swarm corrupt count %d; want 1", s.Corrupt)
			}
			f.corrupt.Store(false)
			l, err := c.Get(context.Background(), w.keys[1], lc.target)
			if err != nil {
				t.Fatal(err)
			}
			l.Release()
			if err := c.check(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A cancelled prefetch frees its reservation; a queued one never runs.
func TestCancelledPrefetchFreesItsRoom(t *testing.T) {
	w := newWorld(t, 4)
	f := &storeFetcher{st: w.st, gate: make(chan struct{})}
	c, err := New(Config{RAM: 2 * keyLen, Swarm: SwarmSource{f}, PrefetchWorkers: 1, Now: fakeNow()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	running := c.Prefetch(w.keys[0], RAM, 1)
	queued := c.Prefetch(w.keys[1], RAM, 1)
	for f.reads.Load() == 0 { // the first is loading, holding its room
		time.Sleep(time.Millisecond)
	}
	if used := c.Stats()[RAM].Used; used != keyLen {
		t.Fatalf("%d bytes reserved while loading; want %d", used, keyLen)
	}
	queued.Cancel()
	running.Cancel()
	if err := running.Wait(context.Background()); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled prefetch: %v; want context.Canceled", err)
	}
	if err := queued.Wait(context.Background()); err != nil {
		t.Fatalf("queued prefetch: %v", err)
	}
	if s := c.Stats()[RAM]; s.Used != 0 || s.Entries != 0 {
		t.Fatalf("after cancelling: %d bytes in %d entries; want none", s.Used, s.Entries)
	}
	if n := f.reads.Load(); n != 1 {
		t.Fatalf("%d reads; the queued prefetch ran", n)
	}
	// Both count as cancelled, neither as a failure of the prefetch or
	// of the source it was reading.
	st := c.Stats()
	if s := st[RAM]; s.PrefetchCancelled != 2 || s.PrefetchFailed != 0 || s.PrefetchDone != 0 {
		t.Fatalf("RAM prefetches: %d cancelled, %d failed, %d done; want 2, 0, 0", s.PrefetchCancelled, s.PrefetchFailed, s.PrefetchDone)
	}
	if n := st[Swarm].Failures; n != 0 {
		t.Fatalf("%d swarm failures for a read its prefetch cancelled; want 0", n)
	}
}

// A prefetch never evicts what was demanded after it was asked for.
func TestPrefetchSparesLaterDemands(t *testing.T) {
	w := newWorld(t, 4)
	c, err := New(Config{RAM: 2 * keyLen, Disk: DiskSource{w.st}, Now: fakeNow()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	asked := int64(0) // the prefetch was asked before anything else
	for _, k := range w.keys[:2] {
		l, err := c.Get(ctx, k, RAM)
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	if _, err := c.get(ctx, w.keys[2], RAM, asked, true); !errors.Is(err, ErrFull) {
		t.Fatalf("a stale prefetch: %v; want ErrFull (nothing it may evict)", err)
	}
	// Asked now, it may evict them.
	c.mu.Lock()
	now := c.now
	c.mu.Unlock()
	l, err := c.get(ctx, w.keys[2], RAM, now, true)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// Prefetches run by priority, after the one running.
func TestPrefetchPriority(t *testing.T) {
	w := newWorld(t, 6)
	f := &storeFetcher{st: w.st, gate: make(chan struct{})}
	c, _ := New(Config{RAM: 6 * keyLen, Swarm: SwarmSource{f}, PrefetchWorkers: 1, Now: fakeNow()})
	defer c.Close()
	first := c.Prefetch(w.keys[0], RAM, 0)
	for f.reads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	low := c.Prefetch(w.keys[1], RAM, 1)
	high := c.Prefetch(w.keys[2], RAM, 9)
	f.gate <- struct{}{} // the first finishes
	first.Wait(context.Background())
	f.gate <- struct{}{} // the next one: must be high
	high.Wait(context.Background())
	if c.Has(w.keys[1], RAM) {
		t.Fatal("the low-priority prefetch ran before the high one")
	}
	close(f.gate)
	low.Wait(context.Background())
	if !c.Has(w.keys[1], RAM) || !c.Has(w.keys[2], RAM) {
		t.Fatal("prefetches did not complete")
	}
}

// A randomized workload from several goroutines: demands, leases held a
// while, prefetches and cancels. The invariants hold after every step.
//
// The VRAM cases run twice: as they are, and over an arena of two banks
// of 3 slots with the keys declared in groups of 4 (Cache.Group), so that
// groups contend for banks while evictions free and take slots; check
// verifies the placer's books after every operation.
func TestRandomWorkload(t *testing.T) {
	host := levelCase{"vram from disk, RAM in host memory", VRAM, "disk", true, ""}
	for _, lc := range withPolicies(append(conformance, host)) {
		for _, grouped := range []bool{false, true} {
			if grouped && lc.target != VRAM {
				continue
			}
			name := lc.name + "/" + lc.policy
			if grouped {
				name += ", grouped in banks"
			}
			t.Run(name, func(t *testing.T) { randomWorkload(t, lc, grouped) })
		}
	}
}

func randomWorkload(t *testing.T, lc levelCase, grouped bool) {
	w := newWorld(t, 12)
	mem := newMemArena(4, keyLen)
	arena := Arena(mem)
	if grouped {
		mem = newMemArena(6, keyLen)
		arena = bankedArena{mem, 3}
	}
	c, _ := lc.cache(t, w, 4, arena)
	if grouped {
		for i := 0; i < len(w.keys); i += 4 {
			c.Group(w.keys[i : i+4])
		}
	}
	if lc.target == RAM {
		c.Close()
		c, _ = New(Config{RAM: 4 * keyLen, Disk: DiskSource{w.st}, Swarm: SwarmSource{&storeFetcher{st: w.st}}, Now: fakeNow(), Policy: lc.policyName()})
		defer c.Close()
	}
	var wg sync.WaitGroup
	var bad atomic.Value
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			var held []*Lease
			var prefetches []*Prefetch
			defer func() {
				// Settled before the checks below: none still moves
				// entries in the background.
				for _, p := range prefetches {
					p.Wait(context.Background())
				}
			}()
			for i := 0; i < 150; i++ {
				k := w.keys[int(float64(len(w.keys))*r.Float64()*r.Float64())]
				switch op := r.IntN(10); {
				case op < 6:
					l, err := c.Get(context.Background(), k, lc.target)
					if errors.Is(err, ErrFull) {
						break
					}
					if err != nil {
						bad.Store(err)
						return
					}
					if !bytes.Equal(leaseBytes(l, mem), w.want(k)) {
						bad.Store(fmt.Errorf("%v: wrong bytes", k))
						return
					}
					held = append(held, l)
				case op < 8:
					p := c.Prefetch(k, lc.target, Priority(r.IntN(3)))
					prefetches = append(prefetches, p)
					if r.IntN(2) == 0 {
						p.Cancel()
					}
				default:
					if len(held) > 0 {
						held[0].Release()
						held = held[1:]
					}
				}
				if len(held) > 1 {
					held[0].Release()
					held = held[1:]
				}
				if err := c.check(); err != nil {
					bad.Store(err)
					return
				}
			}
			for _, l := range held {
				l.Release()
			}
		}()
	}
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if err := c.check(); err != nil {
		t.Fatal(err)
	}
	if lc.host {
		// Each RAM entry (at most one key) is a host block, and
		// promotions copy from blocks. (RAM may be empty at the end: a
		// prefetch cancelled while loading keeps nothing, after it made
		// room.)
		var entries int
		for _, st := range c.Stats() {
			if st.Level == RAM.String() {
				entries = st.Entries
			}
		}
		if blocks, copies := mem.counts(); blocks != entries || entries > 1 || copies == 0 {
			t.Fatalf("RAM in host memory: %d host blocks live for %d RAM entries (at most 1), %d copies from them", blocks, entries, copies)
		}
		c.Close()
		if blocks, _ := mem.counts(); blocks != 0 {
			t.Fatalf("%d host blocks left after Close", blocks)
		}
	}
}

// The recorder writes what the pager demanded, replayable: under every
// policy, a replay counts what the cache counted.
func TestTraceRecorder(t *testing.T) {
	for _, policy := range PolicyNames {
		t.Run(policy, func(t *testing.T) {
			w := newWorld(t, 4)
			rec := &TraceRecorder{}
			c, _ := New(Config{RAM: 2 * keyLen, Disk: DiskSource{w.st}, Trace: rec, Now: fakeNow(), Policy: policy})
			defer c.Close()
			for i, k := range w.keys {
				c.SetGroup(k, i%2)
			}
			for tok, i := range []int{0, 1, 0, 2, 1, 0} {
				rec.SetToken(tok)
				c.BeginStep(100 + i%2)
				l, err := c.Get(context.Background(), w.keys[i], RAM)
				if err != nil {
					t.Fatal(err)
				}
				l.Release()
			}
			tr := rec.Trace()
			if len(tr.Keys) != 4 || len(tr.Accesses) != 6 || tr.Accesses[5].Token != 5 || tr.Keys[3].Group != 1 || tr.Tokens[3] != 100 || len(tr.Tokens) != 6 {
				t.Fatalf("trace: %d keys (groups %+v), %d accesses, tokens %v", len(tr.Keys), tr.Keys, len(tr.Accesses), tr.Tokens)
			}
			sim := Simulate(tr, mustPolicy(policy), 2*keyLen)
			if got := c.Stats()[RAM]; sim.Hits != int(got.Hits) || sim.Misses != int(got.Misses) {
				t.Fatalf("replay: %d hits %d misses; the cache counted %d and %d", sim.Hits, sim.Misses, got.Hits, got.Misses)
			}
		})
	}
}

// A cache's trace names the level of each prefetch (a VRAM prefetch
// once: not the RAM fetch it goes through), and no demand's.
func TestTraceRecorderPrefetchLevels(t *testing.T) {
	w := newWorld(t, 3)
	rec := &TraceRecorder{}
	c, err := New(Config{RAM: 3 * keyLen, Disk: DiskSource{w.st}, Arena: newMemArena(3, keyLen), Trace: rec, Now: fakeNow()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	if err := c.Prefetch(w.keys[0], RAM, 1).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Prefetch(w.keys[2], VRAM, 1).Wait(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := c.Get(ctx, w.keys[1], VRAM)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	want := []Access{{0, 0, true, TraceRAM}, {0, 1, true, TraceVRAM}, {0, 2, false, TraceAny}}
	if tr := rec.Trace(); !slices.Equal(tr.Accesses, want) {
		t.Fatalf("accesses %+v; want %+v: a prefetch to ram, one to vram, then a demand", tr.Accesses, want)
	}
}

func mustPolicy(name string) Policy {
	p, err := NewPolicy(name)
	if err != nil {
		panic(err)
	}
	return p
}
