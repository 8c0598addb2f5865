package tiers

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

func TestWarm(t *testing.T) {
	for _, lc := range conformance {
		t.Run(lc.name, func(t *testing.T) {
			w := newWorld(t, 6)
			arena := newMemArena(6, keyLen)
			rec := &TraceRecorder{}
			c, f := lc.cache(t, w, 6, arena)
			c.cfg.Trace = rec
			if lc.target == RAM {
				c.level(RAM).budget = 6 * keyLen
			}
			var calls atomic.Int64
			if err := c.Warm(context.Background(), w.keys, lc.target, 4, func(done, total int) {
				calls.Add(1)
				if total != len(w.keys) || done < 1 || done > total {
					t.Errorf("progress %d of %d", done, total)
				}
			}); err != nil {
				t.Fatal(err)
			}
			if calls.Load() != int64(len(w.keys)) {
				t.Fatalf("progress called %d times for %d keys", calls.Load(), len(w.keys))
			}
			if n := len(rec.Trace().Accesses); n != 0 {
				t.Fatalf("warm-up traced %d accesses", n)
			}
			before := c.Stats()
			reads := f.reads.Load()
			for _, k := range w.keys {
				if !c.Has(k, lc.target) {
					t.Fatalf("%v not at %s after Warm", k, lc.target)
				}
				l, err := c.Get(context.Background(), k, lc.target)
				if err != nil {
					t.Fatal(err)
				}
				if got := leaseBytes(l, arena); !bytes.Equal(got, w.want(k)) {
					t.Fatalf("%v: wrong bytes after Warm", k)
				}
				l.Release()
			}
			if f.reads.Load() != reads {
				t.Fatal("a get after Warm went to the source")
			}
			d := c.Stats()[lc.target].Since(before[lc.target])
			if d.Hits != int64(len(w.keys)) || d.Misses != 0 || d.BytesUp != 0 || d.HitRate != 1 {
				t.Fatalf("since warm-up: %+v", d)
			}
		})
	}
}

func TestWarmRefusesMoreThanTheBudget(t *testing.T) {
	w := newWorld(t, 4)
	c, f := conformance[0].cache(t, w, 2, nil) // RAM holds 2 keys
	err := c.Warm(context.Background(), w.keys, RAM, 2, nil)
	if err == nil || !strings.Contains(err.Error(), "warming") {
		t.Fatalf("warm of 4 keys into 2 keys' RAM: %v", err)
	}
	if f.reads.Load() != 0 {
		t.Fatal("a refused warm-up read the source")
	}
	if err := c.Warm(context.Background(), w.keys[:1], Disk, 1, nil); err == nil {
		t.Fatal("warm at disk: no error")
	}
}

// TestHoldAndTouch: Hold leases what is there without counting; a held
// entry is not evicted; Touch counts a hit (stats, trace, policy) after
// the fact, and nothing for what is not there.
func TestHoldAndTouch(t *testing.T) {
	w := newWorld(t, 3)
	rec := &TraceRecorder{}
	c, _ := conformance[0].cache(t, w, 2, nil) // RAM holds 2 keys
	c.cfg.Trace = rec
	ctx := context.Background()
	if l := c.Hold(w.keys[0], RAM); l != nil {
		t.Fatal("Hold of a key never loaded returned a lease")
	}
	if c.Touch(w.keys[0], RAM) {
		t.Fatal("Touch of a key never loaded reported it there")
	}
	if err := c.Warm(ctx, w.keys[:2], RAM, 1, nil); err != nil {
		t.Fatal(err)
	}
	before := c.Stats()[RAM]
	held := c.Hold(w.keys[0], RAM)
	if held == nil || !bytes.Equal(held.Bytes(), w.want(w.keys[0])) {
		t.Fatal("Hold of a loaded key: no lease or wrong bytes")
	}
	if d := c.Stats()[RAM].Since(before); d.Hits != 0 || d.Misses != 0 || len(rec.Trace().Accesses) != 0 {
		t.Fatalf("Hold counted an access: %+v, %d traced", d, len(rec.Trace().Accesses))
	}
	// Key 2 needs room: key 1 goes, key 0 is held.
	l, err := c.Get(ctx, w.keys[2], RAM)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if !c.Has(w.keys[0], RAM) || c.Has(w.keys[1], RAM) {
		t.Fatal("a held entry was evicted, or the other one was not")
	}
	held.Release()
	n := len(rec.Trace().Accesses)
	if !c.Touch(w.keys[0], RAM) {
		t.Fatal("Touch of a present key reported it absent")
	}
	if c.Touch(w.keys[1], RAM) {
		t.Fatal("Touch of an evicted key reported it there")
	}
	d := c.Stats()[RAM].Since(before)
	if d.Hits != 1 || d.Misses != 1 || len(rec.Trace().Accesses) != n+1 {
		t.Fatalf("after Get and Touch: %+v, %d traced (want %d)", d, len(rec.Trace().Accesses), n+1)
	}
}

// countingFetcher counts the FetchSlice calls in flight.
type countingFetcher struct {
	inner          SliceFetcher
	now, most, all atomic.Int64
}

func (f *countingFetcher) FetchSlice(ctx context.Context, c cas.CID, size, off, n int64) ([]byte, error) {
	cur := f.now.Add(1)
	defer f.now.Add(-1)
	f.all.Add(1)
	for {
		m := f.most.Load()
		if cur <= m || f.most.CompareAndSwap(m, cur) {
			break
		}
	}
	time.Sleep(time.Millisecond) // long enough for the others to pile up
	return f.inner.FetchSlice(ctx, c, size, off, n)
}

func TestLimitFetcher(t *testing.T) {
	w := newWorld(t, 1)
	inner := &countingFetcher{inner: &storeFetcher{st: w.st}}
	f := LimitFetcher(inner, 3)
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.FetchSlice(context.Background(), w.blob, int64(len(w.data)), 0, 16<<10); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if inner.all.Load() != 20 || inner.most.Load() > 3 || inner.most.Load() < 2 {
		t.Fatalf("%d calls, at most %d at once (limit 3)", inner.all.Load(), inner.most.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	full := LimitFetcher(&storeFetcher{st: w.st}, 1).(*limitFetcher)
	full.sem <- struct{}{}
	if _, err := full.FetchSlice(ctx, w.blob, int64(len(w.data)), 0, 16<<10); err == nil {
		t.Fatal("a cancelled wait for a full limiter returned no error")
	}
}
