package gpu

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cogentcore/webgpu/wgpu"
)

// Upload is the paging hot path: src goes through a ring of persistently
// mapped staging buffers (Options.StagingBuffers of Options.StagingSize
// bytes), each filled by Options.CopyWorkers goroutines and copied to dst on
// the GPU while the next one fills. queue.WriteBuffer measured ~1.3 GB/s on
// an H100; this path is several times faster (see BENCHMARKS.md).
//
// Three things keep the link busy:
//   - the memcpy into a mapped buffer runs on several goroutines (on the
//     H100's host one thread writes mapped memory at ~8 GB/s, sixteen at
//     ~56 GB/s: BENCHMARKS.md, "Upload staging sweep");
//   - a submitter goroutine per Upload unmaps, encodes and submits each
//     filled buffer while the caller already fills the next one, so the
//     submission's CPU cost is off the copy's path;
//   - an Upload that finds the ring idle starts with small chunks
//     (rampStart, doubling up to the staging size): the GPU starts copying
//     after the first small memcpy instead of after a whole staging buffer.
//     A ring that is busy (uploads back to back) already keeps the GPU fed
//     and gets whole buffers.
//
// The benchmark compares these schedules on each device
// (RDRR_BENCH_UPLOAD_SWEEP=1, upload_mode/...) and says where one upload's
// time goes (transfer_bench_test.go).

// rampStart is the first chunk of an Upload that finds the ring idle.
const rampStart = 1 << 20

// copyPart is the least bytes one copy goroutine is given.
const copyPart = 256 << 10

type stager struct {
	size  uint64
	free  chan *staging
	all   []*staging
	works int
	ramp  uint64 // first chunk of an Upload on an idle ring (0: no ramp)
	// pipelined: a submitter goroutine per Upload (false: the caller
	// submits each chunk itself; kept for the benchmark's comparison).
	pipelined bool
	stats     uploadStats
}

type staging struct {
	raw       *wgpu.Buffer
	mapped    []byte // valid while mapped; nil once unmapped
	err       error  // set by a failed map; the buffer is out of use
	submitted time.Time
}

// uploadStats are Upload's cumulative phase times, so that a benchmark can
// say where an upload's time goes.
type uploadStats struct {
	uploads, chunks, bytes atomic.Int64
	wait                   atomic.Int64 // ns waiting for a free staging buffer
	copy                   atomic.Int64 // ns of memcpy into mapped staging
	submit                 atomic.Int64 // ns to unmap, encode, submit and ask for the map again
	turn                   atomic.Int64 // ns from submit to the buffer's return (GPU copy + poll)
}

// uploadSnapshot is a snapshot of uploadStats.
type uploadSnapshot struct {
	Uploads, Chunks, Bytes   int64
	Wait, Copy, Submit, Turn time.Duration
}

func (u *uploadStats) snapshot() uploadSnapshot {
	return uploadSnapshot{
		Uploads: u.uploads.Load(), Chunks: u.chunks.Load(), Bytes: u.bytes.Load(),
		Wait: time.Duration(u.wait.Load()), Copy: time.Duration(u.copy.Load()),
		Submit: time.Duration(u.submit.Load()), Turn: time.Duration(u.turn.Load()),
	}
}

func (a uploadSnapshot) sub(b uploadSnapshot) uploadSnapshot {
	return uploadSnapshot{a.Uploads - b.Uploads, a.Chunks - b.Chunks, a.Bytes - b.Bytes,
		a.Wait - b.Wait, a.Copy - b.Copy, a.Submit - b.Submit, a.Turn - b.Turn}
}

func (d *Device) stagerLocked() (*stager, error) {
	if d.stager != nil {
		return d.stager, nil
	}
	n := d.opts.StagingBuffers
	st := &stager{size: d.opts.StagingSize, free: make(chan *staging, n), works: d.opts.CopyWorkers, pipelined: true}
	if st.size > rampStart {
		st.ramp = rampStart
	}
	for i := 0; i < n; i++ {
		raw, err := d.createMappedLocked("staging", st.size)
		if err != nil {
			st.closeLocked()
			return nil, fmt.Errorf("staging buffer: %w", err)
		}
		s := &staging{raw: raw, mapped: raw.GetMappedRange(0, uint(st.size))}
		st.all = append(st.all, s)
		st.free <- s
	}
	d.stager = st
	return st, nil
}

// createMappedLocked creates a buffer the host writes and the GPU copies
// from (MAP_WRITE | COPY_SRC), mapped: the staging ring's buffers and
// HostBuffers.
func (d *Device) createMappedLocked(label string, size uint64) (*wgpu.Buffer, error) {
	var raw *wgpu.Buffer
	var cerr error
	ne := scoped(d.dev, func() {
		raw, cerr = d.dev.CreateBuffer(&wgpu.BufferDescriptor{
			Label:            label,
			Size:             size,
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
		return nil, d.noteNative(ne)
	}
	return raw, nil
}

func (st *stager) closeLocked() {
	for _, s := range st.all {
		s.raw.Destroy()
		s.raw.Release()
	}
	st.all = nil
}

// setUploadMode changes how Upload schedules its chunks (for the
// benchmark's comparison of the strategies): ramp is the first chunk on an
// idle ring (0: whole staging buffers only), pipelined submits from a
// goroutine of its own.
func (d *Device) setUploadMode(ramp uint64, pipelined bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	st, err := d.stagerLocked()
	if err != nil {
		return err
	}
	st.ramp, st.pipelined = min(ramp, st.size), pipelined
	return nil
}

// uploadStats returns Upload's cumulative phase times.
func (d *Device) uploadStats() uploadSnapshot {
	d.mu.Lock()
	st := d.stager
	d.mu.Unlock()
	if st == nil {
		return uploadSnapshot{}
	}
	return st.stats.snapshot()
}

// Upload copies src into dst (a *Buffer or a Span) through the staging
// ring. It returns once src has been copied out (the caller may reuse it)
// and every GPU copy is submitted; the copies may still be running, but
// work submitted afterwards sees the data (one queue, in order). dst's
// offset must be a multiple of 4; a length that is not is padded with
// zeros up to the next multiple of 4, which must fit in the buffer. Safe
// for concurrent use; ctx bounds the waits for a free staging buffer (on
// an error some chunks may have been copied and others not).
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
	var ramp uint64
	var pipelined bool
	if err == nil {
		ramp, pipelined = st.ramp, st.pipelined
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	st.stats.uploads.Add(1)
	st.stats.bytes.Add(int64(len(src)))
	chunk := st.size
	if ramp > 0 && len(st.free) == cap(st.free) {
		chunk = ramp // the ring is idle: start the GPU early
	}
	var sub *submitter
	if pipelined && uint64(len(src)) > chunk {
		sub = d.newSubmitter(st, sp.buf)
	}
	var uerr error
	for pos := uint64(0); pos < uint64(len(src)); {
		s, err := d.takeStaging(ctx, st)
		if err != nil {
			uerr = err
			break
		}
		n := min(chunk, uint64(len(src))-pos)
		n4 := alignUp(n, 4)
		t0 := time.Now()
		parallelCopy(s.mapped[:n], src[pos:pos+n], st.works)
		clear(s.mapped[n:n4])
		st.stats.copy.Add(int64(time.Since(t0)))
		st.stats.chunks.Add(1)
		if sub != nil {
			if !sub.send(s, sp.off+pos, n4) {
				break // the submitter failed; it says why below
			}
		} else if err := d.stageCopy(st, s, sp.buf, sp.off+pos, n4); err != nil {
			uerr = err
			break
		}
		pos += n
		chunk = min(2*chunk, st.size)
	}
	if sub != nil {
		if err := sub.finish(); err != nil {
			uerr = err // the first failure: later ones follow from it
		}
	}
	return uerr
}

// takeStaging waits for a free, mapped staging buffer.
func (d *Device) takeStaging(ctx context.Context, st *stager) (*staging, error) {
	t0 := time.Now()
	defer func() { st.stats.wait.Add(int64(time.Since(t0))) }()
	var s *staging
	select {
	case s = <-st.free:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-d.lostCh:
		return nil, *d.lost.Load()
	}
	if s.err != nil {
		st.free <- s
		return nil, s.err
	}
	if s.mapped == nil {
		d.mu.Lock()
		defer d.mu.Unlock()
		if err := d.usable(); err != nil { // Close destroys the ring
			st.free <- s
			return nil, err
		}
		s.mapped = s.raw.GetMappedRange(0, uint(st.size))
	}
	return s, nil
}

// submitter submits the filled staging buffers of one Upload from its own
// goroutine, in order. After a failure it returns the buffers it is sent
// to the ring unsubmitted.
type submitter struct {
	jobs chan stageJob
	done chan struct{}
	err  error // set before done closes
	bad  atomic.Bool
}

type stageJob struct {
	s      *staging
	off, n uint64
}

func (d *Device) newSubmitter(st *stager, dst *Buffer) *submitter {
	u := &submitter{jobs: make(chan stageJob, cap(st.free)), done: make(chan struct{})}
	go func() {
		defer close(u.done)
		for j := range u.jobs {
			if u.err != nil {
				st.free <- j.s
				continue
			}
			if err := d.stageCopy(st, j.s, dst, j.off, j.n); err != nil {
				u.err = err
				u.bad.Store(true)
			}
		}
	}()
	return u
}

// send queues a filled buffer; false (and s back in the ring) once the
// submitter has failed. The channel holds as many jobs as the ring has
// buffers, so send never blocks for long.
func (u *submitter) send(s *staging, off, n uint64) bool {
	u.jobs <- stageJob{s, off, n}
	return !u.bad.Load()
}

// finish waits until every queued buffer is submitted (or returned) and
// returns the first error.
func (u *submitter) finish() error {
	close(u.jobs)
	<-u.done
	return u.err
}

// stageCopy unmaps s, copies its first n bytes to dst at off on the GPU and
// asks for s to be mapped again; the map callback returns s to the ring.
func (d *Device) stageCopy(st *stager, s *staging, dst *Buffer, off, n uint64) error {
	t0 := time.Now()
	defer func() { st.stats.submit.Add(int64(time.Since(t0))) }()
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
	idx, ne := d.copyLocked("upload", s.raw, 0, dst.raw, off, n)
	if ne != nil {
		err := d.noteNative(ne)
		s.err = fmt.Errorf("upload: %w", err)
		st.free <- s
		return s.err
	}
	d.noteSubmit(idx)
	s.submitted = time.Now()
	op := d.newOp(func(status uint32) {
		if status != statusSuccess {
			s.err = fmt.Errorf("upload: %w: staging map failed with status %d", ErrValidation, status)
			if status == statusLost || status == statusClosed {
				s.err = fmt.Errorf("upload: %w", ErrDeviceLost)
			}
		}
		st.stats.turn.Add(int64(time.Since(s.submitted)))
		st.free <- s
	})
	if ne := mapAsync(d.dev, s.raw, wgpu.MapModeWrite, 0, st.size, op.complete); ne != nil {
		return fmt.Errorf("upload: %w", d.noteNative(ne))
	}
	d.wake()
	return nil
}

// parallelCopy copies src to dst with up to workers goroutines, each at
// least copyPart bytes.
func parallelCopy(dst, src []byte, workers int) {
	parts := min(workers, max(1, len(src)/copyPart))
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
	r, err := d.StartRead(src, len(dst))
	if err != nil {
		return err
	}
	return r.Wait(ctx, dst)
}

// A PendingRead is a read-back on its way: StartRead submitted the copy,
// Wait collects it.
type PendingRead struct {
	d  *Device
	rb *Buffer
	n  int
	op *asyncOp
}

// StartRead starts reading n bytes of src (a *Buffer or a Span) as they
// are after all work submitted before the call, without waiting: the
// host can record or encode more work meanwhile (work submitted later
// does not delay the read). Wait collects the bytes; a PendingRead must
// be waited for, or its buffer stays held until the device closes.
func (d *Device) StartRead(src Region, n int) (*PendingRead, error) {
	sp := src.span()
	if n < 0 {
		return nil, fmt.Errorf("read: %w: %d bytes", ErrShape, n)
	}
	if err := d.checkCopy(sp, uint64(n)); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	n4 := alignUp(uint64(n), 4)
	if n4 == 0 {
		return &PendingRead{d: d}, nil
	}
	d.mu.Lock()
	if err := d.usable(); err != nil {
		d.mu.Unlock()
		return nil, err
	}
	d.drainLocked()
	if sp.buf.state != bufLive {
		d.mu.Unlock()
		return nil, fmt.Errorf("read: %w: buffer %d was released", ErrClosed, sp.buf.id)
	}
	rb, err := d.allocLocked(usageReadback, n4)
	if err != nil {
		d.mu.Unlock()
		return nil, fmt.Errorf("read: %w", err)
	}
	idx, ne := d.copyLocked("read back", sp.buf.raw, sp.off, rb.raw, 0, n4)
	if ne != nil {
		d.releaseLocked(rb)
		d.mu.Unlock()
		return nil, fmt.Errorf("read: %w", d.noteNative(ne))
	}
	d.noteSubmit(idx)
	r, err := d.mapReadLocked(rb, n, n4)
	d.mu.Unlock()
	if err == nil {
		d.wake()
	}
	return r, err
}

// SubmitRead submits b with a read of n bytes of src after its work, in
// the same command buffer, and returns the read as StartRead does: one
// submission where Submit and StartRead make two (each boundary between
// submissions idled an H200 for 40-60 us in a decode step;
// experts/BENCHMARKS.md, 2026-11-29, late). b is spent either way. An
// error from the read's mapping comes after the batch was submitted (it
// may have run); any other error submits nothing. A profile
// (StartProfile) does not time the read's copy.
func (b *Batch) SubmitRead(ctx context.Context, src Region, n int) (*PendingRead, error) {
	d := b.d
	sp := src.span()
	err := func() error {
		if b.done {
			return fmt.Errorf("%w: batch already submitted", ErrClosed)
		}
		if n < 0 {
			return fmt.Errorf("%w: %d bytes", ErrShape, n)
		}
		return d.checkCopy(sp, uint64(n))
	}()
	if err != nil {
		b.Drop()
		return nil, fmt.Errorf("read: %w", err)
	}
	n4 := alignUp(uint64(n), 4)
	if n4 == 0 {
		if err := b.Submit(ctx); err != nil {
			return nil, err
		}
		return &PendingRead{d: d}, nil
	}
	d.mu.Lock()
	rb, err := func() (*Buffer, error) {
		if err := d.usable(); err != nil {
			return nil, err
		}
		d.drainLocked()
		return d.allocLocked(usageReadback, n4)
	}()
	d.mu.Unlock()
	if err != nil {
		b.Drop()
		return nil, fmt.Errorf("read: %w", err)
	}
	b.cmds = append(b.cmds, command{src: Span{sp.buf, sp.off, n4}, dst: Span{rb, 0, n4}})
	if err := b.Submit(ctx); err != nil {
		d.mu.Lock()
		d.releaseLocked(rb)
		d.mu.Unlock()
		return nil, err
	}
	d.mu.Lock()
	if err := d.usable(); err != nil { // closed since the submit
		d.releaseLocked(rb)
		d.mu.Unlock()
		return nil, fmt.Errorf("read: %w", err)
	}
	r, err := d.mapReadLocked(rb, n, n4)
	d.mu.Unlock()
	if err == nil {
		d.wake()
	}
	return r, err
}

// mapReadLocked maps rb (n bytes of a read, n4 rounded up to 4) for
// reading once the work submitted before it has run. On an error rb is
// given back.
func (d *Device) mapReadLocked(rb *Buffer, n int, n4 uint64) (*PendingRead, error) {
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
		d.releaseLocked(rb)
		return nil, fmt.Errorf("read: %w", d.noteNative(ne))
	}
	return &PendingRead{d: d, rb: rb, n: n, op: op}, nil
}

// Wait blocks until the read's bytes are back or ctx ends, and copies
// them into dst (len(dst) must be the n given to StartRead).
func (r *PendingRead) Wait(ctx context.Context, dst []byte) error {
	if len(dst) != r.n {
		return fmt.Errorf("read: %w: %d bytes into %d", ErrShape, r.n, len(dst))
	}
	if r.rb == nil {
		return nil
	}
	d, rb := r.d, r.rb
	if err := r.op.wait(ctx, d); err != nil {
		r.rb = nil
		if ctx.Err() != nil && err == ctx.Err() {
			return err // the callback hands the buffer back
		}
		d.mu.Lock()
		d.releaseLocked(rb)
		d.mu.Unlock()
		return fmt.Errorf("read: %w", err)
	}
	r.rb = nil
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(dst, rb.raw.GetMappedRange(0, uint(alignUp(uint64(r.n), 4))))
	rb.raw.Unmap()
	d.releaseLocked(rb)
	return nil
}

// copyLocked encodes and submits one buffer-to-buffer copy; kind names it
// in a running profile. Callers hold d.mu and have checked that neither
// buffer is mapped or destroyed.
func (d *Device) copyLocked(kind string, src *wgpu.Buffer, srcOff uint64, dst *wgpu.Buffer, dstOff, n uint64) (uint64, *nativeError) {
	var idx uint64
	var inner *nativeError
	var prof *profiled
	ne := scoped(d.dev, func() {
		enc, err := d.dev.CreateCommandEncoder(nil)
		if err != nil {
			inner = &nativeError{typ: errTypeValidation, msg: err.Error()}
			return
		}
		defer enc.Release()
		timed := d.beginTimedCopy(enc, kind)
		if err := enc.CopyBufferToBuffer(src, srcOff, dst, dstOff, n); err != nil {
			inner = &nativeError{typ: errTypeValidation, msg: err.Error()}
			return
		}
		prof = timed.end(d, enc)
		cb, err := enc.Finish(nil)
		if err != nil {
			inner = &nativeError{typ: errTypeValidation, msg: err.Error()}
			return
		}
		defer cb.Release()
		idx, inner = submit(d.dev, d.queue, cb)
	})
	if prof != nil {
		if inner != nil || ne != nil {
			prof.qs.Release()
			d.releaseLocked(prof.times)
		} else {
			d.prof.pending = append(d.prof.pending, *prof)
		}
	}
	if inner != nil {
		return 0, inner
	}
	return idx, ne
}
