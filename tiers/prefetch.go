package tiers

import (
	"container/heap"
	"context"
	"sync"
)

// Prefetch is a promotion running or queued in the background.
type Prefetch struct {
	c       *Cache
	key     Key
	level   Level
	prio    Priority
	askedAt int64
	seq     uint64
	ctx     context.Context
	cancel  context.CancelFunc
	idx     int // in the queue; -1 once taken or cancelled
	done    chan struct{}
	mu      sync.Mutex
	err     error
}

// Cancel stops the prefetch: a queued one never runs, a running one stops
// its load and frees what it reserved. Safe to call more than once.
func (p *Prefetch) Cancel() {
	p.cancel()
	p.c.mu.Lock()
	if p.idx >= 0 {
		heap.Remove(&p.c.pq, p.idx)
		p.c.stats[p.level].prefetchCancelled++
		close(p.done)
	}
	p.c.mu.Unlock()
}

// Wait waits until the prefetch has finished or was cancelled and returns
// its error (nil when the key is now at its level).
func (p *Prefetch) Wait(ctx context.Context) error {
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Prefetch starts promoting k to level in the background, behind every
// demand (demands never queue) and behind prefetches of higher priority.
// It never evicts a leased entry, nor one demanded after this call.
func (c *Cache) Prefetch(k Key, level Level, prio Priority) *Prefetch {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prefetch{c: c, key: k, level: level, prio: prio, ctx: ctx, cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.close {
		p.err, p.idx = ErrClosed, -1
		close(p.done)
		return p
	}
	c.now++
	p.askedAt = c.now
	c.pq.seq++
	p.seq = c.pq.seq
	heap.Push(&c.pq, p)
	c.stats[level].prefetchQueued++
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return p
}

func (c *Cache) prefetchWorker() {
	defer c.wg.Done()
	for {
		c.mu.Lock()
		var p *Prefetch
		if c.pq.Len() > 0 {
			p = heap.Pop(&c.pq).(*Prefetch)
		}
		c.mu.Unlock()
		if p == nil {
			select {
			case <-c.wake:
				continue
			case <-c.quit:
				return
			}
		}
		l, err := c.get(p.ctx, p.key, p.level, p.askedAt, true)
		if l != nil {
			l.Release()
		}
		c.mu.Lock()
		switch {
		case err == nil:
			c.stats[p.level].prefetchDone++
		case p.ctx.Err() != nil:
			// Cancelled while it loaded (a wrong guess), not a failure.
			c.stats[p.level].prefetchCancelled++
		default:
			c.stats[p.level].prefetchFailed++
		}
		c.mu.Unlock()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
		// Another queued prefetch may be waiting for a worker.
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// prefetchQueue is a heap of queued prefetches: higher priority first,
// then the older.
type prefetchQueue struct {
	items []*Prefetch
	seq   uint64
}

func (q *prefetchQueue) Len() int { return len(q.items) }
func (q *prefetchQueue) Less(i, j int) bool {
	a, b := q.items[i], q.items[j]
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	return a.seq < b.seq
}
func (q *prefetchQueue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].idx, q.items[j].idx = i, j
}
func (q *prefetchQueue) Push(x any) {
	p := x.(*Prefetch)
	p.idx = len(q.items)
	q.items = append(q.items, p)
}
func (q *prefetchQueue) Pop() any {
	p := q.items[len(q.items)-1]
	q.items = q.items[:len(q.items)-1]
	p.idx = -1
	return p
}
