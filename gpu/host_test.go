package gpu

import (
	"bytes"
	"errors"
	"testing"
)

// TestHostBuffer fills host buffers of awkward lengths, copies them (whole
// and in part, to awkward offsets) into GPU memory and reads every byte
// back; a buffer that is not sealed, or released, is refused; Stats count
// the live ones; Close frees what is left.
func TestHostBuffer(t *testing.T) {
	d := openDevice(t, Options{})
	ctx := ctxT(t)
	r := rng(t)
	dst, err := d.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Release()
	for _, n := range []int{1, 4, 7, 4096, 65536 + 3, 300<<10 + 1} {
		h, err := d.AllocHost(uint64(n))
		if err != nil {
			t.Fatal(err)
		}
		b := h.Bytes()
		if len(b) != n || h.Len() != n {
			t.Fatalf("host buffer of %d: Bytes %d, Len %d", n, len(b), h.Len())
		}
		if !bytes.Equal(b, make([]byte, n)) {
			t.Fatalf("host buffer of %d does not start as zeros", n)
		}
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		want := bytes.Clone(b)
		if err := d.CopyHost(ctx, dst.Sub(0, uint64(n)), h, 0, uint64(n)); !errors.Is(err, ErrShape) {
			t.Fatalf("copy from an unsealed host buffer: %v, want ErrShape", err)
		}
		if err := h.Seal(); err != nil {
			t.Fatal(err)
		}
		if h.Bytes() != nil {
			t.Fatal("Bytes of a sealed host buffer is not nil")
		}
		const at = 1028
		if err := d.CopyHost(ctx, dst.Sub(at, uint64(n)), h, 0, uint64(n)); err != nil {
			t.Fatalf("copy %d bytes: %v", n, err)
		}
		got := make([]byte, n)
		if err := d.Read(ctx, dst.Sub(at, uint64(n)), got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes copied from a host buffer differ", n)
		}
		if n >= 4096 { // a part: from an offset within the host buffer
			if err := d.CopyHost(ctx, dst.Sub(0, 1024), h, 2048, 1024); err != nil {
				t.Fatal(err)
			}
			part := make([]byte, 1024)
			if err := d.Read(ctx, dst.Sub(0, 1024), part); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(part, want[2048:3072]) {
				t.Fatalf("a part of %d bytes differs", n)
			}
		}
		if err := d.CopyHost(ctx, dst.Sub(0, 8), h, 2, 4); !errors.Is(err, ErrShape) {
			t.Fatalf("copy from an unaligned offset: %v, want ErrShape", err)
		}
		if err := d.CopyHost(ctx, dst, h, 0, uint64(n)+8); !errors.Is(err, ErrShape) {
			t.Fatalf("copy past the host buffer: %v, want ErrShape", err)
		}
		if s := d.Stats(); s.HostBuffers != 1 || s.HostBytes != uint64((n+3)/4*4) {
			t.Fatalf("stats with one host buffer of %d: %d buffers, %d bytes", n, s.HostBuffers, s.HostBytes)
		}
		h.Release()
		h.Release() // twice is fine
		if err := d.CopyHost(ctx, dst.Sub(0, uint64(n)), h, 0, uint64(n)); !errors.Is(err, ErrClosed) {
			t.Fatalf("copy from a released host buffer: %v, want ErrClosed", err)
		}
	}
	if s := d.Stats(); s.HostBuffers != 0 || s.HostBytes != 0 {
		t.Fatalf("stats after release: %d buffers, %d bytes", s.HostBuffers, s.HostBytes)
	}
	// Released after its copy was submitted: the copy still reads it.
	h, err := d.AllocHost(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := 0, h.Bytes(); i < len(b); i++ {
		b[i] = byte(i * 7)
	}
	if err := h.Seal(); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyHost(ctx, dst.Sub(0, 64<<10), h, 0, 64<<10); err != nil {
		t.Fatal(err)
	}
	h.Release()
	got := make([]byte, 64<<10)
	if err := d.Read(ctx, dst.Sub(0, 64<<10), got); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != byte(i*7) {
			t.Fatalf("byte %d of a copy whose host buffer was released after submit: %d", i, b)
		}
	}
	if _, err := d.AllocHost(0); !errors.Is(err, ErrShape) {
		t.Fatalf("AllocHost(0): %v", err)
	}
	left, err := d.AllocHost(100) // left for Close
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	left.Release() // after Close: nothing to free, no crash
	if _, err := d.AllocHost(4); err == nil {
		t.Fatal("AllocHost on a closed device")
	}
}
