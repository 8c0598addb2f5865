package tiers

import (
	"bytes"
	"context"
	"os"
	"testing"

	"github.com/rdrr/peer/gpu"
)

// The VRAM level on a real device (lavapipe here, the H100 there): every
// key read back from its slot equals the blob's bytes, through evictions.
func TestConformanceGPUArena(t *testing.T) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	}
	var o gpu.Options
	if s := os.Getenv("RDRR_GPU_BACKEND"); s != "" {
		o.Backend, _ = gpu.ParseBackend(s)
	}
	d, err := gpu.Open(context.Background(), o)
	if err != nil {
		t.Fatalf("no GPU adapter (make deps installs lavapipe): %v", err)
	}
	defer d.Close()
	arena, err := NewGPUArena(d, keyLen, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Release()
	for _, src := range []string{"disk", "swarm"} {
		w := newWorld(t, 6)
		c, _ := levelCase{target: VRAM, source: src}.cache(t, w, 3, arena)
		ctx := context.Background()
		for round := 0; round < 2; round++ {
			for _, k := range w.keys {
				l, err := c.Get(ctx, k, VRAM)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, k.Len)
				if err := d.Read(ctx, arena.Buffer().Sub(uint64(l.Slot())*keyLen, keyLen), got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, w.want(k)) {
					t.Fatalf("%s: slot %d holds the wrong bytes for %v", src, l.Slot(), k)
				}
				l.Release()
				if err := c.check(); err != nil {
					t.Fatal(err)
				}
			}
		}
		c.Close()
	}
	// A budget larger than one buffer degrades, never fails.
	huge, err := NewGPUArena(d, 64<<20, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if huge.Slots() >= 1<<20 || huge.Slots() == 0 {
		t.Fatalf("an arena of 64 TiB came back with %d slots", huge.Slots())
	}
	huge.Release()
}
