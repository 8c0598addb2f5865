package tiers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdrr/peer/cas"
)

// Warm brings every key to level before a run or a measurement, workers
// at a time, releasing each lease at once (the entries stay until evicted).
// Keys of one blob go to one worker in order, so a source that rebuilds or
// fetches a whole blob (a procedural shard, a swarm fetch) does it once.
// Warm's accesses are not traced; they count in Stats as any access does,
// so a measurement takes Stats before and after and reports Since.
// progress, if not nil, is called after each key (from the workers).
func (c *Cache) Warm(ctx context.Context, keys []Key, level Level, workers int, progress func(done, total int)) error {
	if level != VRAM && level != RAM {
		return fmt.Errorf("tiers: warm %s (want vram or ram)", level)
	}
	var total int64
	for _, k := range keys {
		if err := k.check(); err != nil {
			return err
		}
		total += k.Len
	}
	if b := c.level(level).budget; total > b {
		return fmt.Errorf("tiers: warming %d bytes into a %s level of %d", total, level, b)
	}
	var groups [][]Key
	byBlob := map[cas.CID]int{}
	for _, k := range keys {
		i, ok := byBlob[k.Blob]
		if !ok {
			i = len(groups)
			byBlob[k.Blob] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], k)
	}
	workers = max(1, min(workers, len(groups)))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next, done atomic.Int64
		wg         sync.WaitGroup
		errOnce    sync.Once
		firstErr   error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(groups) || ctx.Err() != nil {
					return
				}
				for _, k := range groups[i] {
					l, err := c.get(ctx, k, level, -1, false)
					if err != nil {
						errOnce.Do(func() { firstErr = fmt.Errorf("tiers: warm %v: %w", k, err); cancel() })
						return
					}
					l.Release()
					if n := done.Add(1); progress != nil {
						progress(int(n), len(keys))
					}
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// Since is s less the counters of before (the same level's Stats taken
// earlier): what happened in between. Budget, Used, Entries and
// QueueDepth are s's.
func (s LevelStats) Since(before LevelStats) LevelStats {
	d := s
	d.Hits -= before.Hits
	d.Misses -= before.Misses
	d.BytesUp -= before.BytesUp
	d.BytesDown -= before.BytesDown
	d.Evictions -= before.Evictions
	d.Failures -= before.Failures
	d.Corrupt -= before.Corrupt
	d.PrefetchQueued -= before.PrefetchQueued
	d.PrefetchDone -= before.PrefetchDone
	d.PrefetchFailed -= before.PrefetchFailed
	d.PrefetchCancelled -= before.PrefetchCancelled
	d.LatencySum -= before.LatencySum
	d.Latency = make(map[string]int64, len(s.Latency))
	for b, n := range s.Latency {
		d.Latency[b] = n - before.Latency[b]
	}
	d.HitRate = 0
	if n := d.Hits + d.Misses; n > 0 {
		d.HitRate = float64(d.Hits) / float64(n)
	}
	return d
}
