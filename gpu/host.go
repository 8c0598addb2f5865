package gpu

import (
	"context"
	"fmt"

	"github.com/cogentcore/webgpu/wgpu"
)

// A HostBuffer is host memory the GPU copies from directly: a mappable
// buffer of its own (MAP_WRITE | COPY_SRC), written once through Bytes and
// then sealed. CopyHost moves it into GPU memory with one copy on the copy
// engine and no memcpy. The tiers keep their RAM level's entries in
// HostBuffers, so that promoting one to VRAM is that copy alone: on the
// H100 one 64 MiB copy from a mapped buffer runs at ~41 GB/s, while an
// Upload through the staging ring runs at ~23 GB/s, most of its time the
// memcpy into staging (BENCHMARKS.md).
//
// A HostBuffer's memory is pinned host memory that the driver maps for the
// GPU: allocate it for data that will be copied to the GPU, not as a
// general buffer.
type HostBuffer struct {
	d      *Device
	raw    *wgpu.Buffer
	size   uint64 // bytes asked for
	cap    uint64 // allocated: size rounded up to 4
	mapped []byte // nil once sealed
	state  bufState
}

// AllocHost returns a HostBuffer of n bytes, mapped for writing (Bytes).
// Its contents start as zeros.
func (d *Device) AllocHost(n uint64) (*HostBuffer, error) {
	if n == 0 {
		return nil, fmt.Errorf("%w: host buffer of 0 bytes", ErrShape)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return nil, err
	}
	if n > d.limits.MaxBufferSize {
		return nil, fmt.Errorf("%w: host buffer of %d bytes; the device's max buffer size is %d", ErrLimit, n, d.limits.MaxBufferSize)
	}
	c := alignUp(n, 4)
	raw, err := d.createMappedLocked("host", c)
	if err != nil {
		return nil, fmt.Errorf("host buffer of %d bytes: %w", n, err)
	}
	h := &HostBuffer{d: d, raw: raw, size: n, cap: c, mapped: raw.GetMappedRange(0, uint(c))[:n]}
	if d.hosts == nil {
		d.hosts = map[*HostBuffer]struct{}{}
	}
	d.hosts[h] = struct{}{}
	d.counters.hostBytes += c
	return h, nil
}

// Len is the size asked for at AllocHost.
func (h *HostBuffer) Len() int { return int(h.size) }

// Bytes returns the buffer's memory for writing, or nil once it is sealed
// or released. The slice is valid until Seal or Release.
func (h *HostBuffer) Bytes() []byte {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	if h.state != bufLive {
		return nil
	}
	return h.mapped
}

// Seal ends writing: the GPU may copy from the buffer from now on, and the
// host no longer sees its memory (Bytes returns nil).
func (h *HostBuffer) Seal() error {
	d := h.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if h.state != bufLive {
		return fmt.Errorf("%w: host buffer released", ErrClosed)
	}
	if err := d.usable(); err != nil {
		return err
	}
	if h.mapped != nil {
		h.raw.Unmap()
		h.mapped = nil
	}
	return nil
}

// Release frees the buffer. A copy already submitted from it still reads
// the data (the native buffer lives until that copy ran).
func (h *HostBuffer) Release() {
	if h == nil {
		return
	}
	d := h.d
	d.mu.Lock()
	defer d.mu.Unlock()
	h.destroyLocked()
}

func (h *HostBuffer) destroyLocked() {
	if h.state == bufDestroyed {
		return
	}
	h.state = bufDestroyed
	h.mapped = nil
	delete(h.d.hosts, h)
	h.d.counters.hostBytes -= h.cap
	h.raw.Release() // not Destroy: a submitted copy keeps it alive until it ran
}

// CopyHost copies n bytes of src from srcOff into dst (a *Buffer or a
// Span), one copy on the GPU's queue. Like Upload it returns once the copy
// is submitted: work submitted afterwards sees the data. src must be
// sealed; offsets and n are multiples of 4 (n may be src's unpadded
// length, which is padded to 4 within its allocation).
func (d *Device) CopyHost(ctx context.Context, dst Region, src *HostBuffer, srcOff, n uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sp := dst.span()
	if err := d.checkCopy(sp, n); err != nil {
		return fmt.Errorf("copy host: %w", err)
	}
	n4 := alignUp(n, 4)
	if src == nil || src.d != d {
		return fmt.Errorf("copy host: %w: host buffer of another device", ErrShape)
	}
	if srcOff%4 != 0 || srcOff+n4 > src.cap {
		return fmt.Errorf("copy host: %w: %d bytes at %d of a %d-byte host buffer", ErrShape, n, srcOff, src.size)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	switch {
	case src.state != bufLive:
		return fmt.Errorf("copy host: %w: host buffer released", ErrClosed)
	case src.mapped != nil:
		return fmt.Errorf("copy host: %w: host buffer not sealed", ErrShape)
	case sp.buf.state != bufLive:
		return fmt.Errorf("copy host: %w: destination buffer %d was released", ErrClosed, sp.buf.id)
	}
	idx, ne := d.copyLocked("copy host", src.raw, srcOff, sp.buf.raw, sp.off, n4)
	if ne != nil {
		return fmt.Errorf("copy host: %w", d.noteNative(ne))
	}
	d.noteSubmit(idx)
	return nil
}
