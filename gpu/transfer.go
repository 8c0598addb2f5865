package gpu

import (
	"context"
	"fmt"
	"sync"

	"github.com/cogentcore/webgpu/wgpu"
)

// Upload is the paging hot path: src goes through a ring of persistently
// mapped staging buffers (Options.StagingBuffers of Options.StagingSize
// bytes), each filled by Options.CopyWorkers goroutines and copied to dst on
// the GPU while the next one fills. queue.WriteBuffer measured ~1.3 GB/s on
// an H100; this path is several times faster (see BENCHMARKS.md).

type stager struct {
	size  uint64
	free  chan *staging
	all   []*staging
	works int
}

type staging struct {
	raw    *wgpu.Buffer
	mapped []byte // valid while mapped; nil once unmapped
	err    error  // set by a failed map; the buffer is out of use
}

func (d *Device) stagerLocked() (*stager, error) {
	if d.stager != nil {
		return d.stager, nil
	}
	n := d.opts.StagingBuffers
	st := &stager{size: d.opts.StagingSize, free: make(chan *staging, n), works: d.opts.CopyWorkers}
	for i := 0; i < n; i++ {
		var raw *wgpu.Buffer
		var cerr error
		ne := scoped(d.dev, func() {
			raw, cerr = d.dev.CreateBuffer(&wgpu.BufferDescriptor{
				Label:            "staging",
				Size:             st.size,
				Usage:            wgpu.BufferUsageMapWrite | wgpu.BufferUsageCopySrc,
				MappedAtCreation: true,
			})
		})
		if ne == nil && cerr != nil {
			ne = &nativeError{typ: errTypeValidation, msg: cerr.Error()}
		}
		if ne != nil {
			if raw != nil {
				raw.Release()
			}
			st.closeLocked()
			return nil, fmt.Errorf("staging buffer: %w", d.noteNative(ne))
		}
		s := &staging{raw: raw, mapped: raw.GetMappedRange(0, uint(st.size))}
		st.all = append(st.all, s)
		st.free <- s
	}
	d.stager = st
	return st, nil
}

func (st *stager) closeLocked() {
	for _, s := range st.all {
		s.raw.Destroy()
		s.raw.Release()
	}
	st.all = nil
}

// Upload copies src into dst (a *Buffer or a Span) through the staging
// ring. It returns once src has been copied out (the caller may reuse it);
// the GPU copies may still be running, but work submitted afterwards sees
// the data (one queue, in order). dst's offset must be a multiple of 4; a
// length that is not is padded with zeros up to the next multiple of 4,
// which must fit in the buffer. Safe for concurrent use; ctx bounds the
// waits for a free staging buffer.
func (d *Device) Upload(ctx context.Context, dst Region, src []byte) error {
	sp := dst.span()
	if err := d.checkCopy(sp, uint64(len(src))); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	d.mu.Lock()
	if err := d.usable(); err != nil {
		d.mu.Unlock()
		return err
	}
	st, err := d.stagerLocked()
	d.mu.Unlock()
	if err != nil {
		return err
	}
	for pos := uint64(0); pos < uint64(len(src)); {
		var s *staging
		select {
		case s = <-st.free:
		case <-ctx.Done():
			return ctx.Err()
		case <-d.lostCh:
			return *d.lost.Load()
		}
		if s.err != nil {
			st.free <- s
			return s.err
		}
		if s.mapped == nil {
			d.mu.Lock()
			s.mapped = s.raw.GetMappedRange(0, uint(st.size))
			d.mu.Unlock()
		}
		n := min(st.size, uint64(len(src))-pos)
		n4 := alignUp(n, 4)
		parallelCopy(s.mapped[:n], src[pos:pos+n], st.works)
		clear(s.mapped[n:n4])
		if err := d.stageCopy(st, s, sp.buf, sp.off+pos, n4); err != nil {
			return err
		}
		pos += n
	}
	return nil
}

// stageCopy unmaps s, copies its first n bytes to dst at off on the GPU and
// asks for s to be mapped again; the map callback returns s to the ring.
func (d *Device) stageCopy(st *stager, s *staging, dst *Buffer, off, n uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		st.free <- s
		return err
	}
	if dst.state != bufLive {
		st.free <- s
		return fmt.Errorf("upload: %w: destination buffer %d was released", ErrClosed, dst.id)
	}
	s.raw.Unmap()
	s.mapped = nil
	idx, ne := d.copyLocked(s.raw, 0, dst.raw, off, n)
	if ne != nil {
		err := d.noteNative(ne)
		s.err = fmt.Errorf("upload: %w", err)
		st.free <- s
		return s.err
	}
	d.noteSubmit(idx)
	op := d.newOp(func(status uint32) {
		if status != statusSuccess {
			s.err = fmt.Errorf("upload: %w: staging map failed with status %d", ErrValidation, status)
			if status == statusLost || status == statusClosed {
				s.err = fmt.Errorf("upload: %w", ErrDeviceLost)
			}
		}
		st.free <- s
	})
	if ne := mapAsync(d.dev, s.raw, wgpu.MapModeWrite, 0, st.size, op.complete); ne != nil {
		return fmt.Errorf("upload: %w", d.noteNative(ne))
	}
	d.wake()
	return nil
}

// parallelCopy copies src to dst with up to workers goroutines, each at
// least 1 MiB.
func parallelCopy(dst, src []byte, workers int) {
	const minPart = 1 << 20
	parts := min(workers, max(1, len(src)/minPart))
	if parts <= 1 {
		copy(dst, src)
		return
	}
	part := alignUp(uint64((len(src)+parts-1)/parts), 64)
	var wg sync.WaitGroup
	for lo := uint64(0); lo < uint64(len(src)); lo += part {
		hi := min(lo+part, uint64(len(src)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[lo:hi], src[lo:hi])
		}()
	}
	wg.Wait()
}

// checkCopy validates that n bytes (padded to 4) fit in sp.
func (d *Device) checkCopy(sp Span, n uint64) error {
	if sp.buf == nil {
		return fmt.Errorf("%w: nil buffer", ErrShape)
	}
	if sp.buf.d != d {
		return fmt.Errorf("%w: buffer belongs to another device", ErrShape)
	}
	if sp.off%4 != 0 {
		return fmt.Errorf("%w: offset %d is not a multiple of 4", ErrShape, sp.off)
	}
	if n > sp.size || sp.off+sp.size > sp.buf.cap || sp.off+alignUp(n, 4) > sp.buf.cap {
		return fmt.Errorf("%w: %d bytes do not fit in %v (allocated %d)", ErrShape, n, sp, sp.buf.cap)
	}
	return nil
}

// Write copies src into dst with queue.WriteBuffer: simple and ordered with
// submitted work, but slow for large data (use Upload for weights). Padding
// rules as for Upload.
func (d *Device) Write(dst Region, src []byte) error {
	sp := dst.span()
	if err := d.checkCopy(sp, uint64(len(src))); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if len(src)%4 != 0 {
		p := make([]byte, alignUp(uint64(len(src)), 4))
		copy(p, src)
		src = p
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return err
	}
	if sp.buf.state != bufLive {
		return fmt.Errorf("write: %w: buffer %d was released", ErrClosed, sp.buf.id)
	}
	var werr error
	ne := scoped(d.dev, func() { werr = d.queue.WriteBuffer(sp.buf.raw, sp.off, src) })
	if ne == nil && werr != nil {
		ne = &nativeError{typ: errTypeValidation, msg: werr.Error()}
	}
	if ne != nil {
		return fmt.Errorf("write: %w", d.noteNative(ne))
	}
	return nil
}

// Read copies len(dst) bytes from src (a *Buffer or a Span) into dst,
// after all work submitted before the call. It blocks until the data is
// back or ctx ends.
func (d *Device) Read(ctx context.Context, src Region, dst []byte) error {
	sp := src.span()
	if err := d.checkCopy(sp, uint64(len(dst))); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	n4 := alignUp(uint64(len(dst)), 4)
	if n4 == 0 {
		return nil
	}
	d.mu.Lock()
	if err := d.usable(); err != nil {
		d.mu.Unlock()
		return err
	}
	d.drainLocked()
	if sp.buf.state != bufLive {
		d.mu.Unlock()
		return fmt.Errorf("read: %w: buffer %d was released", ErrClosed, sp.buf.id)
	}
	rb, err := d.allocLocked(usageReadback, n4)
	if err != nil {
		d.mu.Unlock()
		return fmt.Errorf("read: %w", err)
	}
	idx, ne := d.copyLocked(sp.buf.raw, sp.off, rb.raw, 0, n4)
	if ne != nil {
		d.releaseLocked(rb)
		d.mu.Unlock()
		return fmt.Errorf("read: %w", d.noteNative(ne))
	}
	d.noteSubmit(idx)
	var op *asyncOp
	op = d.newOp(func(status uint32) {
		// Runs in a callback: if the reader gave up, hand the buffer back
		// at the next drain.
		op.mu.Lock()
		dropped := op.dropped
		op.mu.Unlock()
		if dropped {
			d.later(func() {
				if status == statusSuccess {
					rb.raw.Unmap()
				}
				d.releaseLocked(rb)
			})
		}
	})
	if ne := mapAsync(d.dev, rb.raw, wgpu.MapModeRead, 0, n4, op.complete); ne != nil {
		d.mu.Unlock()
		return fmt.Errorf("read: %w", d.noteNative(ne))
	}
	d.mu.Unlock()
	d.wake()
	if err := op.wait(ctx, d); err != nil {
		if ctx.Err() != nil && err == ctx.Err() {
			return err
		}
		d.mu.Lock()
		d.releaseLocked(rb)
		d.mu.Unlock()
		return fmt.Errorf("read: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(dst, rb.raw.GetMappedRange(0, uint(n4)))
	rb.raw.Unmap()
	d.releaseLocked(rb)
	return nil
}

// copyLocked encodes and submits one buffer-to-buffer copy. Callers hold
// d.mu and have checked that neither buffer is mapped or destroyed.
func (d *Device) copyLocked(src *wgpu.Buffer, srcOff uint64, dst *wgpu.Buffer, dstOff, n uint64) (uint64, *nativeError) {
	var idx uint64
	var inner *nativeError
	ne := scoped(d.dev, func() {
		enc, err := d.dev.CreateCommandEncoder(nil)
		if err != nil {
			inner = &nativeError{typ: errTypeValidation, msg: err.Error()}
			return
		}
		defer enc.Release()
		if err := enc.CopyBufferToBuffer(src, srcOff, dst, dstOff, n); err != nil {
			inner = &nativeError{typ: errTypeValidation, msg: err.Error()}
			return
		}
		cb, err := enc.Finish(nil)
		if err != nil {
			inner = &nativeError{typ: errTypeValidation, msg: err.Error()}
			return
		}
		defer cb.Release()
		idx, inner = submit(d.dev, d.queue, cb)
	})
	if inner != nil {
		return 0, inner
	}
	return idx, ne
}
