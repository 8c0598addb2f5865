package tiers

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/rdrr/peer/cas"
)

// Level is one level of the cache, fastest first.
type Level int

// The levels.
const (
	VRAM Level = iota
	RAM
	Disk
	Swarm
	numLevels
)

func (l Level) String() string {
	switch l {
	case VRAM:
		return "vram"
	case RAM:
		return "ram"
	case Disk:
		return "disk"
	case Swarm:
		return "swarm"
	}
	return fmt.Sprintf("level(%d)", int(l))
}

// Key is a byte range of a blob: an expert inside a shard. Size is the
// whole blob's size (a range is verified against the blob's CID, which
// needs it).
type Key struct {
	Blob     cas.CID
	Size     int64
	Off, Len int64
}

func (k Key) String() string { return fmt.Sprintf("%s[%d,+%d)", k.Blob, k.Off, k.Len) }

func (k Key) check() error {
	if k.Off < 0 || k.Len <= 0 || k.Off+k.Len > k.Size || k.Len > MaxKeyLen {
		return fmt.Errorf("tiers: bad key %v of a %d-byte blob (at most %d bytes)", k, k.Size, MaxKeyLen)
	}
	return nil
}

// MaxKeyLen bounds one key's bytes (a Mixtral expert is 99 MB).
const MaxKeyLen = 1 << 30

// Priority orders prefetches (higher first); a demand always comes
// before any prefetch.
type Priority int

// Source delivers verified bytes from a level below the cached ones.
type Source interface {
	// Has reports whether the source can deliver k without going further.
	Has(k Key) bool
	// Read fills dst (len k.Len) with k's bytes, verified against k.Blob;
	// bytes that fail verification are an error wrapping cas.ErrCorrupt
	// and are never left in dst as if good. Safe for concurrent use; ctx
	// cancels the read.
	Read(ctx context.Context, k Key, dst []byte) error
}

// Arena is the VRAM level's storage: equal slots in GPU memory.
type Arena interface {
	Slots() int
	SlotSize() int64
	// Upload copies data (at most SlotSize bytes) into slot. Safe for
	// concurrent use on different slots.
	Upload(ctx context.Context, slot int, data []byte) error
}

// HostArena is an Arena with host memory that it copies from directly
// (GPUArena: gpu.HostBuffer). With Config.HostRAM, the RAM entries of keys
// bound for VRAM live there, and promoting one is a single copy on the
// GPU's copy engine instead of a memcpy into staging and a copy.
type HostArena interface {
	Arena
	// AllocHost returns n bytes of host memory, writable until sealed.
	AllocHost(n int64) (HostBlock, error)
	// UploadHost copies a sealed block into slot.
	UploadHost(ctx context.Context, slot int, b HostBlock) error
}

// HostBlock is host memory of a HostArena: written through Bytes, then
// sealed, after which only the GPU reads it.
type HostBlock interface {
	Bytes() []byte // nil once sealed
	Seal() error
	Release()
}

// Config configures a Cache.
type Config struct {
	// RAM is the RAM level's budget in bytes (0: no RAM level; keys go
	// from a source straight to VRAM through a transient buffer).
	RAM int64
	// Arena is the VRAM level (nil: none).
	Arena Arena
	// HostRAM keeps the RAM entries of keys bound for VRAM (asked for at
	// the VRAM level, or named by ForVRAM) in the arena's host memory,
	// when the arena is a HostArena: their promotion is then one DMA
	// copy. Such entries have no Bytes. If host memory runs out, entries
	// fall back to ordinary memory with a warning.
	HostRAM bool
	// Disk and Swarm are the sources, tried in that order (either may be nil).
	Disk, Swarm Source
	// Policy names the eviction policy of both cached levels: lru, lfu,
	// cost or cycle (default cycle: tiers/BENCHMARKS.md).
	Policy string
	// PrefetchWorkers bounds prefetches running at once (default 2).
	PrefetchWorkers int
	// Trace, if not nil, records every demand and prefetch (trace format).
	Trace *TraceRecorder
	// Now is the clock of latency measurements (default time.Now).
	Now    func() time.Time
	Logger *slog.Logger
}

// Errors.
var (
	// ErrFull: every entry of a level is leased, so nothing can be evicted
	// to make room.
	ErrFull = errors.New("tiers: level full of leased entries")
	// ErrNoSource: no level below has the key.
	ErrNoSource = errors.New("tiers: no source has the key")
	ErrClosed   = errors.New("tiers: cache closed")
)

// SourceError is a read from a source that failed; for bytes that did not
// verify it wraps cas.ErrCorrupt and names the source.
type SourceError struct {
	Level Level
	Key   Key
	Err   error
}

func (e *SourceError) Error() string { return fmt.Sprintf("tiers: %s: %v: %v", e.Level, e.Key, e.Err) }
func (e *SourceError) Unwrap() error { return e.Err }

// Cache is the VRAM/RAM cache of byte ranges over the disk and swarm
// sources. Safe for concurrent use.
type Cache struct {
	cfg        Config
	mu         sync.Mutex
	now        int64 // logical clock: one tick per access
	ids        map[Key]int
	keys       []Key
	lv         [2]*cacheLevel // VRAM, RAM
	stats      [numLevels]levelStats
	pq         prefetchQueue
	gpuBound   map[int]bool // keys bound for VRAM (HostRAM)
	hostWarned bool
	wake       chan struct{}
	quit       chan struct{}
	wg         sync.WaitGroup
	close      bool
}

// cacheLevel is one of the two cached levels.
type cacheLevel struct {
	level   Level
	budget  int64 // bytes (VRAM: slots x slot size)
	used    int64 // bytes of entries, loading ones included
	entries map[int]*entry
	policy  Policy
	heap    evictHeap
	ver     map[int]uint64
	place   *placer // VRAM: which slots are free (place.go)
}

// entry is one key at one level.
type entry struct {
	id         int
	size       int64
	ready      bool
	err        error
	done       chan struct{} // closed when loaded (or failed)
	leases     int
	data       []byte    // RAM
	host       HostBlock // RAM, instead of data: in the arena's host memory (HostRAM)
	slot       int       // VRAM
	lastDemand int64     // logical time of the last demand
}

// New makes a cache. Budgets that the device or the machine cannot give
// are the caller's to clamp (see Clamp).
func New(cfg Config) (*Cache, error) {
	if cfg.Policy == "" {
		cfg.Policy = "cycle"
	}
	if cfg.PrefetchWorkers <= 0 {
		cfg.PrefetchWorkers = 2
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cache{cfg: cfg, ids: map[Key]int{}, gpuBound: map[int]bool{}, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	for i, l := range []Level{VRAM, RAM} {
		p, err := NewPolicy(cfg.Policy)
		if err != nil {
			return nil, err
		}
		cl := &cacheLevel{level: l, entries: map[int]*entry{}, policy: p, ver: map[int]uint64{}}
		if l == RAM {
			cl.budget = cfg.RAM
		} else if cfg.Arena != nil {
			cl.budget = int64(cfg.Arena.Slots()) * cfg.Arena.SlotSize()
			cl.place = newPlacer(cfg.Arena)
		}
		c.lv[i] = cl
	}
	for range cfg.PrefetchWorkers {
		c.wg.Add(1)
		go c.prefetchWorker()
	}
	return c, nil
}

// Close stops the prefetch workers and cancels queued prefetches.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.close {
		c.mu.Unlock()
		return nil
	}
	c.close = true
	for _, p := range c.pq.items {
		p.cancel()
	}
	c.mu.Unlock()
	close(c.quit)
	c.wg.Wait()
	// Host memory is pinned: give it back now rather than at exit.
	c.mu.Lock()
	for _, e := range c.lv[1].entries {
		if e.host != nil {
			e.host.Release()
			e.host = nil
		}
	}
	c.mu.Unlock()
	return nil
}

// Lease is a key held at a level: it cannot be evicted until Release.
type Lease struct {
	c     *Cache
	lv    *cacheLevel
	e     *entry
	Key   Key
	Level Level
	// Loaded is true when this Get loaded the key into Level (a miss it
	// filled), false when it found it there or waited for another load.
	Loaded bool
	once   sync.Once
}

// Bytes returns the key's bytes (a RAM lease). Valid until Release; do not
// modify them. An entry kept in the arena's host memory (Config.HostRAM)
// has none: only the GPU reads it.
func (l *Lease) Bytes() []byte { return l.e.data }

// Slot returns the arena slot that holds the key (a VRAM lease).
func (l *Lease) Slot() int { return l.e.slot }

// Release makes the entry evictable again. Safe to call more than once.
func (l *Lease) Release() {
	l.once.Do(func() {
		l.c.mu.Lock()
		l.e.leases--
		l.c.mu.Unlock()
	})
}

func (c *Cache) level(l Level) *cacheLevel {
	if l == VRAM {
		return c.lv[0]
	}
	return c.lv[1]
}

// id returns the dense id of k (the policy's and the trace's key).
func (c *Cache) idLocked(k Key) int {
	id, ok := c.ids[k]
	if !ok {
		id = len(c.keys)
		c.ids[k] = id
		c.keys = append(c.keys, k)
		if c.cfg.Trace != nil {
			c.cfg.Trace.key(id, k)
		}
	}
	return id
}

// Get returns a lease on k at level (VRAM or RAM), promoting it from the
// levels below: RAM, then the disk source, then the swarm source, each
// verified on the way up. Concurrent gets of one key share one load.
func (c *Cache) Get(ctx context.Context, k Key, level Level) (*Lease, error) {
	return c.get(ctx, k, level, -1, true)
}

// get is Get for a demand (askedAt < 0) or a prefetch asked at logical
// time askedAt, which may evict only what was not demanded since. record
// says whether the access goes into the trace (a VRAM load's own RAM get
// does not).
func (c *Cache) get(ctx context.Context, k Key, level Level, askedAt int64, record bool) (*Lease, error) {
	if err := k.check(); err != nil {
		return nil, err
	}
	if level != VRAM && level != RAM {
		return nil, fmt.Errorf("tiers: Get at %s (want vram or ram)", level)
	}
	lv := c.level(level)
	if lv.budget == 0 && level == VRAM {
		return nil, fmt.Errorf("tiers: no VRAM level")
	}
	if k.Len > lv.budget || (level == VRAM && k.Len > c.cfg.Arena.SlotSize()) {
		return nil, fmt.Errorf("tiers: %v (%d bytes) does not fit the %s level", k, k.Len, level)
	}
	demand := askedAt < 0
	t0 := c.cfg.Now()
	c.mu.Lock()
	if c.close {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	id := c.idLocked(k)
	if level == VRAM {
		c.gpuBound[id] = true
	}
	c.now++
	if c.cfg.Trace != nil && record {
		c.cfg.Trace.access(id, !demand, level)
	}
	for {
		e := lv.entries[id]
		if e == nil {
			break
		}
		if e.ready {
			e.leases++
			if demand {
				e.lastDemand = c.now
				c.stats[level].hits++
				lv.touchLocked(id, e.size, c.now, true)
			}
			c.mu.Unlock()
			return &Lease{c: c, lv: lv, e: e, Key: k, Level: level}, nil
		}
		// Being loaded: wait for it, then look again.
		c.mu.Unlock()
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		c.mu.Lock()
		if e.err != nil && !errors.Is(e.err, context.Canceled) && !errors.Is(e.err, context.DeadlineExceeded) {
			// The load we waited for failed for a reason that is not
			// its caller's own cancellation: the same read would fail.
			err := e.err
			c.mu.Unlock()
			return nil, err
		}
	}
	// A miss: reserve room, then load outside the lock.
	if demand {
		c.stats[level].misses++
	}
	e := &entry{id: id, size: k.Len, done: make(chan struct{}), leases: 1}
	if demand {
		e.lastDemand = c.now
	}
	if err := lv.reserveLocked(c, e, askedAt); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	lv.entries[id] = e
	c.mu.Unlock()

	err := c.load(ctx, k, lv, e)
	if err == nil && !demand && ctx.Err() != nil {
		err = ctx.Err() // a cancelled prefetch keeps nothing
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		e.err = err
		lv.dropLocked(e)
		close(e.done)
		return nil, err
	}
	e.ready = true
	inserted(lv.policy, id, e.size, c.now, !demand)
	lv.rankLocked(id)
	c.stats[level].bytesUp += k.Len
	c.stats[level].observe(c.cfg.Now().Sub(t0))
	close(e.done)
	return &Lease{c: c, lv: lv, e: e, Key: k, Level: level, Loaded: true}, nil
}

// load fills e with k's bytes: for VRAM from a RAM lease (or a transient
// buffer when there is no RAM level), for RAM from the first source that
// has k.
func (c *Cache) load(ctx context.Context, k Key, lv *cacheLevel, e *entry) error {
	if lv.level == VRAM {
		var data []byte
		if c.lv[1].budget >= k.Len {
			rl, err := c.get(ctx, k, RAM, -1, false)
			if err != nil {
				return err
			}
			defer rl.Release()
			if rl.e.host != nil {
				return c.cfg.Arena.(HostArena).UploadHost(ctx, e.slot, rl.e.host)
			}
			data = rl.Bytes()
		} else {
			data = make([]byte, k.Len)
			if err := c.readSource(ctx, k, data); err != nil {
				return err
			}
		}
		return c.cfg.Arena.Upload(ctx, e.slot, data)
	}
	if blk := c.hostBlock(k, e.id); blk != nil {
		if err := c.readSource(ctx, k, blk.Bytes()); err != nil {
			blk.Release()
			return err
		}
		if err := blk.Seal(); err != nil {
			blk.Release()
			return err
		}
		e.host = blk
		return nil
	}
	e.data = make([]byte, k.Len)
	return c.readSource(ctx, k, e.data)
}

// hostBlock returns host memory of the arena for the RAM entry of key id,
// or nil when the entry is to be ordinary memory: HostRAM is off, the
// arena has no host memory, the key is not bound for VRAM, or host
// memory ran out (then with a warning, once).
func (c *Cache) hostBlock(k Key, id int) HostBlock {
	ha, ok := c.cfg.Arena.(HostArena)
	if !c.cfg.HostRAM || !ok {
		return nil
	}
	c.mu.Lock()
	bound := c.gpuBound[id]
	c.mu.Unlock()
	if !bound {
		return nil
	}
	blk, err := ha.AllocHost(k.Len)
	if err != nil {
		c.mu.Lock()
		warn := !c.hostWarned
		c.hostWarned = true
		c.mu.Unlock()
		if warn {
			c.cfg.Logger.Warn("tiers: no more host memory for the GPU; RAM entries go to ordinary memory (their uploads go through staging)", "key", k, "err", err)
		}
		return nil
	}
	return blk
}

// ForVRAM names keys bound for the VRAM level before any VRAM access (a
// warm-up of RAM ahead of a run): with Config.HostRAM their RAM entries
// are made in the arena's host memory.
func (c *Cache) ForVRAM(keys []Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		if k.check() == nil {
			c.gpuBound[c.idLocked(k)] = true
		}
	}
}

// Group declares keys that a kernel reads together from one arena bank
// (BankedArena: one GPU buffer), such as the gate and up matrices of an
// MoE layer's experts: the VRAM level keeps them in one bank when it can
// (place.go). Declare a group before its keys are loaded.
func (c *Cache) Group(keys []Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lv := c.lv[0]
	if lv.place == nil {
		return
	}
	ids := make([]int, 0, len(keys))
	for _, k := range keys {
		if k.check() == nil {
			ids = append(ids, c.idLocked(k))
		}
	}
	lv.place.group(ids)
}

// readSource reads k from the disk source if it has k, else the swarm.
func (c *Cache) readSource(ctx context.Context, k Key, dst []byte) error {
	for _, s := range []struct {
		level Level
		src   Source
	}{{Disk, c.cfg.Disk}, {Swarm, c.cfg.Swarm}} {
		if s.src == nil || (s.level == Disk && !s.src.Has(k)) {
			continue
		}
		t0 := c.cfg.Now()
		err := s.src.Read(ctx, k, dst)
		c.mu.Lock()
		st := &c.stats[s.level]
		if err != nil {
			corrupt := errors.Is(err, cas.ErrCorrupt)
			if corrupt {
				st.corrupt++
			}
			if corrupt || ctx.Err() == nil { // a read its caller cancelled did not fail
				st.failures++
			}
		} else {
			st.hits++
			st.bytesUp += k.Len
			st.observe(c.cfg.Now().Sub(t0))
		}
		c.mu.Unlock()
		if err != nil {
			clear(dst)            // nothing unverified is left behind
			if ctx.Err() == nil { // a cancelled prefetch is not news
				c.cfg.Logger.Warn("tiers: source read failed", "level", s.level, "key", k, "err", err)
			}
			return &SourceError{Level: s.level, Key: k, Err: err}
		}
		return nil
	}
	return fmt.Errorf("%w: %v", ErrNoSource, k)
}

// touchLocked tells the policy of an access and re-ranks id.
func (lv *cacheLevel) touchLocked(id int, size int64, now int64, hit bool) {
	lv.policy.Access(id, size, now, hit)
	lv.rankLocked(id)
}

// rankLocked re-ranks id by its policy's score (an AgingPolicy ranks its
// entries itself: no heap).
func (lv *cacheLevel) rankLocked(id int) {
	if _, ok := lv.policy.(AgingPolicy); ok {
		return
	}
	lv.ver[id]++
	heap.Push(&lv.heap, heapItem{lv.policy.Score(id), id, lv.ver[id]})
}

// reserveLocked makes room for e (evicting unleased entries, lowest score
// first; a prefetch asked at askedAt evicts nothing demanded since) and
// counts its bytes.
func (lv *cacheLevel) reserveLocked(c *Cache, e *entry, askedAt int64) error {
	if ap, ok := lv.policy.(AgingPolicy); ok {
		return lv.reserveAgingLocked(c, e, askedAt, ap)
	}
	var skipped []heapItem
	defer func() {
		for _, it := range skipped {
			heap.Push(&lv.heap, it)
		}
	}()
	for lv.used+e.size > lv.budget || (lv.level == VRAM && lv.place.nfree == 0) {
		if lv.heap.Len() == 0 {
			return fmt.Errorf("%w (%s: %d of %d bytes)", ErrFull, lv.level, lv.used, lv.budget)
		}
		it := heap.Pop(&lv.heap).(heapItem)
		v, ok := lv.entries[it.id]
		if !ok || !v.ready || it.ver != lv.ver[it.id] {
			continue // stale
		}
		if v.leases > 0 || (askedAt >= 0 && v.lastDemand > askedAt) {
			skipped = append(skipped, it)
			continue
		}
		lv.evictLocked(c, v)
	}
	lv.admitLocked(e)
	return nil
}

// reserveAgingLocked is reserveLocked for a policy that picks each victim
// itself; the entries it may pick are the same.
func (lv *cacheLevel) reserveAgingLocked(c *Cache, e *entry, askedAt int64, ap AgingPolicy) error {
	evictable := func(id int) bool {
		v, ok := lv.entries[id]
		return ok && v.ready && v.leases == 0 && (askedAt < 0 || v.lastDemand <= askedAt)
	}
	for lv.used+e.size > lv.budget || (lv.level == VRAM && lv.place.nfree == 0) {
		id, ok := ap.Victim(c.now, evictable)
		if !ok {
			return fmt.Errorf("%w (%s: %d of %d bytes)", ErrFull, lv.level, lv.used, lv.budget)
		}
		lv.evictLocked(c, lv.entries[id])
	}
	lv.admitLocked(e)
	return nil
}

// evictLocked evicts v and tells the policy.
func (lv *cacheLevel) evictLocked(c *Cache, v *entry) {
	lv.dropLocked(v)
	lv.policy.Remove(v.id)
	c.stats[lv.level].evictions++
	c.stats[lv.level].bytesDown += v.size
}

// admitLocked counts e's bytes and, in VRAM, gives it a slot.
func (lv *cacheLevel) admitLocked(e *entry) {
	lv.used += e.size
	if lv.level == VRAM {
		e.slot = lv.place.take(e.id)
	}
}

// dropLocked removes e and frees its room.
func (lv *cacheLevel) dropLocked(e *entry) {
	if lv.entries[e.id] == e {
		delete(lv.entries, e.id)
	}
	lv.used -= e.size
	if lv.level == VRAM {
		lv.place.put(e.id, e.slot)
	}
	e.data = nil
	if e.host != nil {
		// A copy already submitted from it still reads it (HostBlock).
		e.host.Release()
		e.host = nil
	}
}

// Has reports whether k is ready at level (for tests and stats).
func (c *Cache) Has(k Key, level Level) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.ids[k]
	if !ok {
		return false
	}
	e := c.level(level).entries[id]
	return e != nil && e.ready
}

// check verifies the cache's invariants: budgets are never exceeded, the
// bytes counted are the entries' bytes, VRAM slots are each used once.
// For tests: it runs under the lock.
func (c *Cache) check() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, lv := range c.lv {
		var sum int64
		slots := map[int]bool{}
		for id, e := range lv.entries {
			if e.id != id {
				return fmt.Errorf("%s: entry %d filed under %d", lv.level, e.id, id)
			}
			sum += e.size
			if e.leases < 0 {
				return fmt.Errorf("%s: entry %d has %d leases", lv.level, id, e.leases)
			}
			if lv.level == VRAM {
				if slots[e.slot] {
					return fmt.Errorf("vram: slot %d used twice", e.slot)
				}
				slots[e.slot] = true
			}
			if lv.level == RAM && e.ready && e.host == nil && int64(len(e.data)) != e.size {
				return fmt.Errorf("ram: entry %d holds %d bytes; want %d", id, len(e.data), e.size)
			}
		}
		if sum != lv.used {
			return fmt.Errorf("%s: entries hold %d bytes; counted %d", lv.level, sum, lv.used)
		}
		if lv.used > lv.budget {
			return fmt.Errorf("%s: %d bytes used of a %d budget", lv.level, lv.used, lv.budget)
		}
		if lv.level == VRAM && c.cfg.Arena != nil {
			if err := lv.place.check(slots, c.cfg.Arena.Slots()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Hold leases k at level if it is there and ready, without counting an
// access: no stats, no trace, no change to what the policy knows. It is
// for work that may or may not use k, such as a GPU step that picks among
// a layer's resident experts on the GPU; count what it really used with
// Touch. It returns nil if k is not ready at level.
func (c *Cache) Hold(k Key, level Level) *Lease {
	if level != VRAM && level != RAM {
		return nil
	}
	lv := c.level(level)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		return nil
	}
	id, ok := c.ids[k]
	if !ok {
		return nil
	}
	e := lv.entries[id]
	if e == nil || !e.ready {
		return nil
	}
	e.leases++
	return &Lease{c: c, lv: lv, e: e, Key: k, Level: level}
}

// Touch counts a demand of k at level that found it there, as Get counts
// a hit (stats, trace, policy), without a lease: the other half of Hold,
// told after the fact which of the held keys were used. It reports
// whether k was there; if it was not, nothing is counted.
func (c *Cache) Touch(k Key, level Level) bool {
	if level != VRAM && level != RAM {
		return false
	}
	lv := c.level(level)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		return false
	}
	id, ok := c.ids[k]
	if !ok {
		return false
	}
	e := lv.entries[id]
	if e == nil || !e.ready {
		return false
	}
	c.now++
	if c.cfg.Trace != nil {
		c.cfg.Trace.access(id, false, level)
	}
	e.lastDemand = c.now
	c.stats[level].hits++
	lv.touchLocked(id, e.size, c.now, true)
	return true
}

// SetGroup tells the cache that k is used at place group of each step's
// walk over the model (its layer), for the policies that use it
// (GroupPolicy: forecast) and the trace. Negative groups and groups past
// MaxTraceGroup are ignored.
func (c *Cache) SetGroup(k Key, group int) {
	if group < 0 || group > MaxTraceGroup || k.check() != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		return
	}
	id := c.idLocked(k)
	for _, lv := range c.lv {
		if gp, ok := lv.policy.(GroupPolicy); ok {
			gp.SetGroup(id, group)
		}
	}
	if c.cfg.Trace != nil {
		c.cfg.Trace.group(id, group)
	}
}

// BeginStep tells the cache that a decode step begins and which token it
// embeds (negative: unknown), for the policies that use it (StepPolicy:
// forecast) and the trace. The accesses after it are the step's.
func (c *Cache) BeginStep(token int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		return
	}
	for _, lv := range c.lv {
		if sp, ok := lv.policy.(StepPolicy); ok {
			sp.BeginStep(token)
		}
	}
	if c.cfg.Trace != nil && token >= 0 {
		c.cfg.Trace.step(token)
	}
}
