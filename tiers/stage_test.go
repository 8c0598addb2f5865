package tiers

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// A prefetch to RAM of a key bound for VRAM copies it into the stage pool,
// and its promotion is then a copy from that block (no upload through
// staging) with the right bytes; keys in VRAM already, or not bound for
// it, are not staged; a full pool gives the oldest staged entry's block
// to the newest; an entry evicted from RAM gives its block back; Close
// releases every block.
func TestStagedPrefetch(t *testing.T) {
	w := newWorld(t, 6)
	arena := newMemArena(3, keyLen)
	c, err := New(Config{RAM: 6 * keyLen, Arena: arena, Stage: 2*keyLen + keyLen/2, Disk: DiskSource{w.st}, Now: fakeNow()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	c.ForVRAM(w.keys[:5]) // not the last
	prefetch := func(k Key) {
		t.Helper()
		if err := c.Prefetch(k, RAM, 1).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.check(); err != nil {
			t.Fatal(err)
		}
	}
	promote := func(k Key) {
		t.Helper()
		l, err := c.Get(ctx, k, VRAM)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(arena.read(l.Slot(), k.Len), w.want(k)) {
			t.Fatalf("%v: wrong bytes in VRAM", k)
		}
		l.Release()
		if err := c.check(); err != nil {
			t.Fatal(err)
		}
	}
	want := func(what string, staged, used, unused int64, uploads, hostCopies int) {
		t.Helper()
		st := c.Stats()[RAM]
		_, up, hc := arena.counts()
		if st.Staged != staged || st.StagedUsed != used || st.StagedUnused != unused || up != uploads || hc != hostCopies {
			t.Fatalf("%s: staged %d, used %d, unused %d, uploads %d, host copies %d; want %d %d %d %d %d",
				what, st.Staged, st.StagedUsed, st.StagedUnused, up, hc, staged, used, unused, uploads, hostCopies)
		}
	}
	prefetch(w.keys[0])
	want("one prefetch", 1, 0, 0, 0, 0)
	promote(w.keys[0])
	want("its promotion", 1, 1, 0, 0, 1)
	prefetch(w.keys[0])
	want("a prefetch of a key in VRAM", 1, 1, 0, 0, 1)
	prefetch(w.keys[5])
	want("a prefetch of a key not bound for VRAM", 1, 1, 0, 0, 1)

	waitPool(t, c)
	for _, k := range w.keys[1:4] {
		prefetch(k)
	}
	want("three prefetches into a pool of two", 4, 1, 1, 0, 1)
	if blocks, _, _ := arena.counts(); blocks != 2 {
		t.Fatalf("%d host blocks for a pool of two", blocks)
	}
	for _, k := range w.keys[1:4] {
		promote(k)
	}
	want("their promotions (the first through staging)", 4, 3, 1, 1, 3)

	// RAM of two keys: staging a third evicts one, whose block goes back.
	w2 := newWorld(t, 3)
	arena2 := newMemArena(3, keyLen)
	c2, err := New(Config{RAM: 2 * keyLen, Arena: arena2, Stage: 2 * keyLen, Disk: DiskSource{w2.st}, Now: fakeNow(), Policy: "lru"})
	if err != nil {
		t.Fatal(err)
	}
	c2.ForVRAM(w2.keys)
	for _, k := range w2.keys {
		if err := c2.Prefetch(k, RAM, 1).Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c2.check(); err != nil {
			t.Fatal(err)
		}
	}
	if st := c2.Stats()[RAM]; st.Staged != 3 || st.StagedUnused != 1 || c2.Has(w2.keys[0], RAM) {
		t.Fatalf("a staged entry evicted from RAM: staged %d, unused %d, first key in RAM %v", st.Staged, st.StagedUnused, c2.Has(w2.keys[0], RAM))
	}
	c2.Close()
	c.Close()
	for i, a := range []*memArena{arena, arena2} {
		if blocks, _, _ := a.counts(); blocks != 0 {
			t.Fatalf("cache %d: %d host blocks left after Close", i+1, blocks)
		}
	}
}

// waitPool waits until no stage block is in flight (promoted, not yet
// reopened): the reopen runs in the background.
func waitPool(t *testing.T, c *Cache) {
	t.Helper()
	for try := 0; ; try++ {
		c.mu.Lock()
		p := c.pool
		idle := len(p.free)+len(p.held) == p.n
		c.mu.Unlock()
		if idle {
			return
		}
		if try == 5000 {
			t.Fatal("a stage block never came back")
		}
		time.Sleep(time.Millisecond)
	}
}
