package tiers

import (
	"context"
	"fmt"
	"slices"
)

// The stage pool is a few blocks of the arena's host memory, reused, that
// hold copies of RAM entries about to be promoted to VRAM (Config.Stage).
// A prefetch to RAM of a key bound for VRAM (Get at VRAM before, or
// ForVRAM) that is not in VRAM fills a block with the entry's bytes in the
// background; the promotion then takes the block and is one DMA copy,
// with no memcpy into the staging ring on the demand's path (on the H100
// a 64 MiB promotion from host memory runs at ~41 GB/s, through staging
// at ~23: tiers/BENCHMARKS.md). Unlike Config.HostRAM, the pinned memory
// stays small: every submission costs more while much is pinned.
//
// Blocks are slot-sized, allocated on first use up to the budget and kept
// open for writing until a promotion seals one; once its copy has run it
// is reopened and free again. When every block holds a staged entry, a
// new stage takes the oldest one's (its guess is the stalest).
type stagePool struct {
	max  int         // blocks at most
	n    int         // blocks allocated (free, staged or in flight)
	free []HostBlock // open, holding nothing
	held []*entry    // RAM entries with a staged block, oldest first
}

// stageable reports whether a prefetched RAM entry should be staged:
// its key is bound for VRAM and not there, and it is not staged already,
// being staged or in host memory for good (HostRAM).
func (c *Cache) stageableLocked(e *entry) bool {
	if c.pool == nil || !c.gpuBound[e.id] || e.host != nil || e.staged != nil || e.staging {
		return false
	}
	v := c.lv[0].entries[e.id]
	return v == nil || !v.ready
}

// stage copies the bytes of l (a RAM lease the caller holds until it
// returns) into a block of the pool for its key's promotion, if the key
// is stageable and a block can be had.
func (c *Cache) stage(ctx context.Context, l *Lease) {
	e := l.e
	c.mu.Lock()
	if !c.stageableLocked(e) {
		c.mu.Unlock()
		return
	}
	p := c.pool
	var blk HostBlock
	alloc := false
	switch {
	case len(p.free) > 0:
		blk = p.free[len(p.free)-1]
		p.free = p.free[:len(p.free)-1]
	case p.n < p.max:
		p.n++
		alloc = true
	case len(p.held) > 0:
		v := p.held[0]
		p.held = p.held[1:]
		blk, v.staged = v.staged, nil
		c.stats[RAM].stageDropped++
	default:
		c.mu.Unlock()
		return // every block is in flight
	}
	e.staging = true
	c.mu.Unlock()

	var err error
	if alloc {
		blk, err = c.cfg.Arena.(HostArena).AllocHost(c.cfg.Arena.SlotSize())
	}
	if err == nil {
		err = blk.Fill(e.data)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	e.staging = false
	if err != nil {
		if blk != nil {
			blk.Release()
		}
		p.n--
		if !c.hostWarned {
			c.hostWarned = true
			c.cfg.Logger.Warn("tiers: no host memory to stage a prefetch in; it is promoted through staging", "key", l.Key, "err", err)
		}
		return
	}
	if c.close || ctx.Err() != nil || c.lv[1].entries[e.id] != e || !c.stageableLocked(e) {
		p.free = append(p.free, blk) // cancelled, evicted or promoted meanwhile
		return
	}
	e.staged = blk
	p.held = append(p.held, e)
	c.stats[RAM].staged++
}

// takeStagedLocked detaches e's staged block for its promotion (nil if it
// has none).
func (c *Cache) takeStagedLocked(e *entry) HostBlock {
	blk := e.staged
	if blk == nil {
		return nil
	}
	e.staged = nil
	c.pool.held = slices.DeleteFunc(c.pool.held, func(v *entry) bool { return v == e })
	return blk
}

// unstageLocked gives e's staged block back to the pool unused (e leaves
// RAM).
func (c *Cache) unstageLocked(e *entry) {
	if blk := c.takeStagedLocked(e); blk != nil {
		c.pool.free = append(c.pool.free, blk)
		c.stats[RAM].stageDropped++
	}
}

// promoteStaged copies a staged block into slot: sealed, one copy, then
// reopened in the background (once the copy has run) and free again.
func (c *Cache) promoteStaged(ctx context.Context, slot int, blk HostBlock, n int64) error {
	err := blk.Seal()
	if err == nil {
		err = c.cfg.Arena.(HostArena).UploadHost(ctx, slot, blk, n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		blk.Release() // Close waits for no more goroutines
		c.pool.n--
		return err
	}
	c.stats[RAM].stageUsed++
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		rerr := blk.Reopen(context.Background())
		c.mu.Lock()
		defer c.mu.Unlock()
		if rerr != nil || c.close {
			blk.Release()
			c.pool.n--
			return
		}
		c.pool.free = append(c.pool.free, blk)
	}()
	return err
}

// closePool releases the pool's blocks (after the goroutines are done).
func (c *Cache) closePoolLocked() {
	if c.pool == nil {
		return
	}
	for _, blk := range c.pool.free {
		blk.Release()
	}
	for _, e := range c.pool.held {
		e.staged.Release()
		e.staged = nil
	}
	c.pool.free, c.pool.held, c.pool.n = nil, nil, 0
}

// checkPoolLocked verifies the pool's invariants (Cache.check): blocks
// within the budget, each staged entry in RAM and listed once.
func (c *Cache) checkPoolLocked() error {
	p := c.pool
	if p == nil {
		return nil
	}
	if p.n > p.max || len(p.free)+len(p.held) > p.n {
		return fmt.Errorf("stage pool: %d blocks (at most %d), %d free, %d staged", p.n, p.max, len(p.free), len(p.held))
	}
	listed := map[*entry]bool{}
	for _, e := range p.held {
		if listed[e] || e.staged == nil || c.lv[1].entries[e.id] != e {
			return fmt.Errorf("stage pool: entry %d listed twice, without a block or not in RAM", e.id)
		}
		listed[e] = true
	}
	for _, e := range c.lv[1].entries {
		if e.staged != nil && !listed[e] {
			return fmt.Errorf("stage pool: entry %d has a block but is not listed", e.id)
		}
	}
	return nil
}
