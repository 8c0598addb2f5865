package tiers

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
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
