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
	ctx := context.Background()
	for _, lc := range []levelCase{{source: "disk"}, {source: "swarm"}, {source: "disk", host: true}, {source: "swarm", host: true}} {
		src := lc.source
		if lc.host {
			src += ", RAM in host memory"
		}
		w := newWorld(t, 6)
		lc.target = VRAM
		c, _ := lc.cache(t, w, 3, arena)
		if lc.host {
			// Named ahead: warmed into RAM, they are made in host memory.
			c.ForVRAM(w.keys[:1])
			if err := c.Warm(ctx, w.keys[:1], RAM, 1, nil); err != nil {
				t.Fatal(err)
			}
			if s := d.Stats(); s.HostBuffers != 1 {
				t.Fatalf("%s: %d host buffers after warming one key bound for VRAM into RAM", src, s.HostBuffers)
			}
		}
		for round := 0; round < 2; round++ {
			for _, k := range w.keys {
				l, err := c.Get(ctx, k, VRAM)
				if err != nil {
					t.Fatal(err)
				}
				got := make([]byte, k.Len)
				buf, i := arena.Locate(l.Slot())
				if err := d.Read(ctx, buf.Sub(uint64(i)*keyLen, keyLen), got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, w.want(k)) {
					t.Fatalf("%s: slot %d holds the wrong bytes for %v", src, l.Slot(), k)
				}
				l.Release()
				if err := c.check(); err != nil {
					t.Fatal(err)
				}
				// RAM holds one key (the one just promoted): in host
				// memory exactly when asked for.
				if hb, want := d.Stats().HostBuffers, map[bool]int{false: 0, true: 1}[lc.host]; hb != want {
					t.Fatalf("%s: %d host buffers, want %d", src, hb, want)
				}
			}
		}
		c.Close()
		if s := d.Stats(); s.HostBuffers != 0 {
			t.Fatalf("%s: %d host buffers left after Close", src, s.HostBuffers)
		}
	}
	// A budget larger than the device degrades, never fails.
	huge, err := NewGPUArena(d, 64<<20, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if huge.Slots() >= 1<<20 || huge.Slots() == 0 {
		t.Fatalf("an arena of 64 TiB came back with %d slots", huge.Slots())
	}
	huge.Release()
	// Slots spread over several buffers when one binding cannot hold them
	// (a device asked for 1 MiB buffers: 16 slots each).
	o.MaxBufferSize, o.MaxStorageBinding = 1<<20, 1<<20
	d2, err := gpu.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	d = d2
	per := int(min(d.Info().Limits.MaxBufferSize, d.Info().Limits.MaxStorageBufferBindingSize) / keyLen)
	multi, err := NewGPUArena(d, keyLen, per+2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer multi.Release()
	b0, _ := multi.Locate(0)
	bl, il := multi.Locate(per + 1)
	if multi.Slots() != per+2 || b0 == bl || il != 1 {
		t.Fatalf("arena of %d slots (%d per buffer): slot %d at index %d of another buffer? %v", multi.Slots(), per, per+1, il, b0 != bl)
	}
	data := bytes.Repeat([]byte{7}, keyLen)
	if err := multi.Upload(ctx, per+1, data); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, keyLen)
	if err := d.Read(ctx, bl.Sub(keyLen, keyLen), got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("slot %d read back wrong (%v)", per+1, err)
	}
}
