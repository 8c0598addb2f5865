package gpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"

	"github.com/cogentcore/webgpu/wgpu"
)

// Batch records dispatches and copies and submits them as one command
// buffer (one queue submission): per-token decode work is many small
// dispatches, and a submit per dispatch costs more than the dispatch.
// Recording takes no lock and makes no wgpu call; a Batch is used by one
// goroutine at a time. Buffers and pipelines must stay unreleased until
// Submit returns.
type Batch struct {
	d      *Device
	cmds   []command
	params []byte // uniform arena: each dispatch's params at an aligned offset
	spans  []Span // the dispatches' bindings, each command's carved in turn
	rec    *recording
	err    error // first recording error; Submit returns it
	done   bool
	temps  []*Buffer // scratch buffers of the batch's kernels, pooled again after Submit or Drop
}

// A recording holds a batch's slices for the next batch: a decode step
// records dozens of batches of similar size, and growing their slices
// anew each time was a fifth of the host's recording and encoding
// (BenchmarkEncode).
type recording struct {
	cmds   []command
	params []byte
	spans  []Span
}

var recordings = sync.Pool{New: func() any { return new(recording) }}

// recycle clears what r's slices point at and pools them again; slices
// grown past what a decode step's batches need are left to the collector.
func (r *recording) recycle() {
	if r == nil {
		return
	}
	if cap(r.cmds) > 1<<12 || cap(r.spans) > 1<<14 || cap(r.params) > 1<<20 {
		return
	}
	clear(r.cmds) // past their lengths they are zero already
	clear(r.spans)
	r.cmds, r.params, r.spans = r.cmds[:0], r.params[:0], r.spans[:0]
	recordings.Put(r)
}

type command struct {
	pipe     *Pipeline // nil for copies and clears
	groups   [3]uint32
	paramOff uint32
	spans    []Span
	// copy (src, dst) or clear (dst)
	src, dst Span
	clear    bool
}

// Batch starts an empty batch.
func (d *Device) Batch() *Batch {
	r := recordings.Get().(*recording)
	return &Batch{d: d, rec: r, cmds: r.cmds, params: r.params, spans: r.spans}
}

// handOff moves the batch's slices into its recording and returns it: the
// batch no longer uses them.
func (b *Batch) handOff() *recording {
	r := b.rec
	if r != nil {
		r.cmds, r.params, r.spans = b.cmds, b.params, b.spans
	}
	b.rec, b.params, b.spans = nil, nil, nil
	return r
}

// Fail records err as the batch's first error (Submit returns it) and
// returns it: an op library calls it for what it finds wrong before it
// dispatches (a shape, a binding too small), so that a batch recorded
// without checking each call still fails as a whole. A nil err is
// ignored.
func (b *Batch) Fail(err error) error {
	if err != nil && b.err == nil {
		b.err = err
	}
	return err
}

// Scratch returns a storage buffer of at least n bytes that the batch's
// kernels can use between their dispatches (an op's partial results),
// until the batch is submitted or dropped; then it is pooled again. The
// caller must not release it.
func (b *Batch) Scratch(n uint64) (*Buffer, error) {
	if b.done {
		return nil, fmt.Errorf("%w: batch already submitted", ErrClosed)
	}
	t, err := b.d.Alloc(n)
	if err != nil {
		return nil, b.Fail(err)
	}
	b.temps = append(b.temps, t)
	return t, nil
}

func (b *Batch) releaseTemps() {
	if len(b.temps) == 0 {
		return
	}
	b.d.mu.Lock()
	for _, t := range b.temps {
		if t.state == bufLive {
			b.d.releaseLocked(t)
		}
	}
	b.d.mu.Unlock()
	b.temps = nil
}

// Drop abandons a batch without submitting it (one recorded only to
// compile its pipelines, or after a recording error), handing back its
// scratch buffers.
func (b *Batch) Drop() {
	b.done = true
	b.releaseTemps()
	b.handOff().recycle() // none left after Encode: the Encoded pools it
	b.cmds = nil
}

// Err returns the first error recorded so far (what Submit would return
// first), without submitting: a batch recorded only to compile its
// pipelines is checked this way and dropped.
func (b *Batch) Err() error { return b.err }

// Len is the number of recorded commands.
func (b *Batch) Len() int { return len(b.cmds) }

// Dispatch records p over groups workgroups with the given params bytes
// (at most the kernel's Params size; shorter is zero-padded) and one
// region per storage binding. Errors name the kernel; the first error also
// fails Submit.
func (b *Batch) Dispatch(p *Pipeline, groups [3]uint32, params []byte, bind ...Region) error {
	err := b.dispatch(p, groups, params, bind)
	if err != nil {
		name := "?"
		if p != nil {
			name = p.e.name
		}
		err = &KernelError{Kernel: name, Op: "dispatch", Err: err}
		if b.err == nil {
			b.err = err
		}
	}
	return err
}

func (b *Batch) dispatch(p *Pipeline, groups [3]uint32, params []byte, bind []Region) error {
	if b.done {
		return fmt.Errorf("%w: batch already submitted", ErrClosed)
	}
	if p == nil || p.released.Load() {
		return fmt.Errorf("%w: pipeline released", ErrClosed)
	}
	e := p.e
	if e.d != b.d {
		return fmt.Errorf("%w: pipeline belongs to another device", ErrShape)
	}
	if len(bind) != len(e.bindings) {
		return fmt.Errorf("%w: %d bindings given; kernel declares %d", ErrShape, len(bind), len(e.bindings))
	}
	lim := b.d.limits
	for i, g := range groups {
		if g == 0 {
			return fmt.Errorf("%w: zero workgroups in dimension %d", ErrShape, i)
		}
		if g > lim.MaxComputeWorkgroupsPerDimension {
			return fmt.Errorf("%w: %d workgroups in dimension %d; device max %d", ErrLimit, g, i, lim.MaxComputeWorkgroupsPerDimension)
		}
	}
	if len(params) > e.params {
		return fmt.Errorf("%w: %d bytes of params; kernel declares %d", ErrShape, len(params), e.params)
	}
	if cap(b.spans)-len(b.spans) < len(bind) {
		b.spans = make([]Span, 0, max(2*cap(b.spans), 64))
	}
	spans := b.spans[len(b.spans) : len(b.spans)+len(bind) : len(b.spans)+len(bind)]
	b.spans = b.spans[:len(b.spans)+len(bind)]
	for i, r := range bind {
		if r == nil {
			return fmt.Errorf("%w: binding %d is nil", ErrShape, i)
		}
		s := r.span()
		if err := b.d.checkBinding(s); err != nil {
			return fmt.Errorf("binding %d: %w", i, err)
		}
		spans[i] = s
	}
	// WebGPU tracks usage per buffer, not per range: one buffer cannot be
	// bound read-only and read-write (or twice read-write) in a dispatch.
	for i, s := range spans {
		for j := 0; j < i; j++ {
			if spans[j].buf == s.buf && (e.bindings[i] == ReadWrite || e.bindings[j] == ReadWrite) {
				return fmt.Errorf("%w: bindings %d and %d use the same buffer and one of them writes it", ErrShape, j, i)
			}
		}
	}
	c := command{pipe: p, groups: groups, spans: spans}
	if e.params > 0 {
		align := uint64(b.d.limits.MinUniformBufferOffsetAlignment)
		off := alignUp(uint64(len(b.params)), align)
		b.params = append(b.params, make([]byte, int(off)-len(b.params))...)
		c.paramOff = uint32(off)
		b.params = append(b.params, params...)
		b.params = append(b.params, make([]byte, int(alignUp(uint64(e.params), 16))-len(params))...)
	}
	b.cmds = append(b.cmds, c)
	return nil
}

// checkBinding validates a storage binding against the buffer and limits.
func (d *Device) checkBinding(s Span) error {
	if s.buf == nil {
		return fmt.Errorf("%w: nil buffer", ErrShape)
	}
	if s.buf.d != d {
		return fmt.Errorf("%w: buffer belongs to another device", ErrShape)
	}
	if s.buf.use != usageStorage {
		return fmt.Errorf("%w: not a storage buffer", ErrShape)
	}
	if s.size == 0 {
		return fmt.Errorf("%w: empty range", ErrShape)
	}
	if s.off%uint64(d.limits.MinStorageBufferOffsetAlignment) != 0 {
		return fmt.Errorf("%w: offset %d is not a multiple of %d", ErrShape, s.off, d.limits.MinStorageBufferOffsetAlignment)
	}
	if s.off+s.size > s.buf.cap {
		return fmt.Errorf("%w: %v is outside the buffer (allocated %d)", ErrShape, s, s.buf.cap)
	}
	if bindSize(s) > d.limits.MaxStorageBufferBindingSize {
		return fmt.Errorf("%w: binding of %d bytes; device max storage binding %d", ErrLimit, s.size, d.limits.MaxStorageBufferBindingSize)
	}
	return nil
}

// bindSize rounds a binding up to 16 bytes (kernels read vec4 arrays) when
// the buffer has room; the extra bytes are never used by the shape logic.
func bindSize(s Span) uint64 {
	return min(alignUp(s.size, 16), s.buf.cap-s.off)
}

// Copy records a copy of src into dst (same length, multiples of 4).
func (b *Batch) Copy(dst, src Region) error {
	d, s := dst.span(), src.span()
	err := func() error {
		if b.done {
			return fmt.Errorf("%w: batch already submitted", ErrClosed)
		}
		if d.size != s.size || d.size%4 != 0 || d.off%4 != 0 || s.off%4 != 0 {
			return fmt.Errorf("%w: copy %v to %v (lengths must match and be multiples of 4)", ErrShape, s, d)
		}
		if err := b.d.checkCopy(d, d.size); err != nil {
			return err
		}
		return b.d.checkCopy(s, s.size)
	}()
	if err != nil {
		err = fmt.Errorf("copy: %w", err)
		if b.err == nil {
			b.err = err
		}
		return err
	}
	b.cmds = append(b.cmds, command{src: s, dst: d})
	return nil
}

// Clear records zeroing dst (offset and size multiples of 4).
func (b *Batch) Clear(dst Region) error {
	d := dst.span()
	err := func() error {
		if b.done {
			return fmt.Errorf("%w: batch already submitted", ErrClosed)
		}
		if d.size%4 != 0 {
			return fmt.Errorf("%w: clear of %d bytes (want a multiple of 4)", ErrShape, d.size)
		}
		return b.d.checkCopy(d, d.size)
	}()
	if err != nil {
		err = fmt.Errorf("clear: %w", err)
		if b.err == nil {
			b.err = err
		}
		return err
	}
	b.cmds = append(b.cmds, command{dst: d, clear: true})
	return nil
}

// Submit encodes everything recorded into one command buffer and submits
// it. It does not wait for the GPU: later submissions, Read and Sync see
// the results. The batch cannot be reused.
func (b *Batch) Submit(ctx context.Context) error {
	e, err := b.Encode(ctx)
	if err != nil {
		return err
	}
	return b.d.SubmitEncoded(ctx, e)
}

// An Encoded is a batch encoded into a command buffer and not yet
// submitted: the host's share of a submit (bind groups, the encoder,
// wgpu's checks, the params' upload) paid ahead, so that the submit is
// quick when it is on the critical path. A paged decode step encodes the
// next layer's attention while it waits for this layer's router, and
// submits it right behind the experts the router chose. Submit it with
// Device.SubmitEncoded, or Drop it; what it uses must stay unreleased
// until then (SubmitEncoded checks again and refuses it otherwise).
type Encoded struct {
	d       *Device
	cb      *wgpu.CommandBuffer // nil: nothing was recorded
	cmds    []command
	rec     *recording // cmds' slices, pooled again once e is done
	arena   *Buffer    // its params, written at Encode
	temps   []*Buffer  // the batch's scratch
	prof    *profiled
	untimed int
	done    bool
}

// Encode encodes the batch for a later SubmitEncoded. The batch cannot be
// reused; on an error nothing stays held.
func (b *Batch) Encode(ctx context.Context) (*Encoded, error) {
	if b.done {
		return nil, fmt.Errorf("%w: batch already submitted", ErrClosed)
	}
	b.done = true
	d := b.d
	e := &Encoded{d: d, temps: b.temps, cmds: b.cmds}
	b.temps = nil
	params := b.params
	e.rec = b.handOff() // pooled again when e is submitted or dropped
	defer func() { b.cmds = nil }()
	if b.err != nil {
		e.Drop()
		return nil, b.err
	}
	if err := ctx.Err(); err != nil {
		e.Drop()
		return nil, err
	}
	if len(b.cmds) == 0 {
		return e, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	err := b.encodeLocked(e, params)
	if err != nil {
		e.dropLocked()
		return nil, err
	}
	return e, nil
}

// Drop abandons an encoded batch without submitting it.
func (e *Encoded) Drop() {
	if e == nil || e.done {
		return
	}
	e.d.mu.Lock()
	defer e.d.mu.Unlock()
	e.dropLocked()
}

func (e *Encoded) dropLocked() {
	if e.done {
		return
	}
	e.done = true
	if e.prof != nil {
		e.prof.qs.Release()
		e.d.releaseLocked(e.prof.times)
		e.prof = nil
	}
	e.releaseLocked()
}

// releaseLocked hands back what the encoded batch held: its command
// buffer, params arena and scratch (pooled again: queue order puts a later
// user's commands after a submitted batch's).
func (e *Encoded) releaseLocked() {
	if e.cb != nil {
		e.cb.Release()
		e.cb = nil
	}
	if e.arena != nil {
		e.d.releaseLocked(e.arena)
		e.arena = nil
	}
	for _, t := range e.temps {
		if t.state == bufLive {
			e.d.releaseLocked(t)
		}
	}
	e.temps = nil
	e.cmds = nil
	e.rec.recycle()
	e.rec = nil
}

// SubmitEncoded submits encoded batches, in order, as one queue
// submission, and hands back what they held. If one of them cannot be
// submitted (submitted already, of another device, a pipeline or buffer
// released since Encode) none is, and all are dropped.
func (d *Device) SubmitEncoded(ctx context.Context, es ...*Encoded) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() {
		for _, e := range es {
			if e != nil {
				e.dropLocked()
			}
		}
	}()
	var cbs []*wgpu.CommandBuffer
	for _, e := range es {
		switch {
		case e == nil:
			continue
		case e.d != d:
			return fmt.Errorf("%w: encoded batch of another device", ErrShape)
		case e.done:
			return fmt.Errorf("%w: encoded batch already submitted", ErrClosed)
		}
		if err := e.checkLocked(); err != nil {
			return err
		}
		if e.cb != nil {
			cbs = append(cbs, e.cb)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(cbs) == 0 {
		return nil
	}
	if err := d.usable(); err != nil {
		return fmt.Errorf("submit: %w", err)
	}
	d.drainLocked()
	idx, ne := submit(d.dev, d.queue, cbs...)
	if ne != nil {
		return fmt.Errorf("submit: %w", d.noteNative(ne))
	}
	for _, e := range es {
		if e == nil || e.prof == nil {
			continue
		}
		if d.prof != nil {
			d.prof.pending = append(d.prof.pending, *e.prof)
			d.prof.prof.Untimed += e.untimed
		} else {
			e.prof.qs.Release()
			d.releaseLocked(e.prof.times)
		}
		e.prof = nil
	}
	d.noteSubmit(idx)
	return nil
}

// checkLocked refuses what wgpu-native would abort the process on at
// submit: a pipeline or buffer released since the commands were recorded.
func (e *Encoded) checkLocked() error {
	for _, c := range e.cmds {
		if c.pipe != nil && c.pipe.released.Load() {
			return &KernelError{Kernel: c.pipe.e.name, Op: "submit", Err: fmt.Errorf("%w: pipeline released", ErrClosed)}
		}
		for _, s := range c.all() {
			if s.buf.state != bufLive {
				return wrapCmds(e.cmds, fmt.Errorf("%w: %v was released before submit", ErrClosed, s), "submit")
			}
		}
	}
	return nil
}

func (c command) all() []Span {
	if c.pipe != nil {
		return c.spans
	}
	if c.clear {
		return []Span{c.dst}
	}
	return []Span{c.src, c.dst}
}

// encodeLocked checks the batch, writes its params and encodes its
// commands into e. Callers hold d.mu.
func (b *Batch) encodeLocked(e *Encoded, params []byte) error {
	d := b.d
	if err := d.usable(); err != nil {
		return b.wrap(err, "submit")
	}
	d.drainLocked()
	// wgpu-native aborts the process on an invalid submit, so check what
	// it would reject first (and again at SubmitEncoded).
	if err := e.checkLocked(); err != nil {
		return err
	}
	var arena *Buffer
	if len(params) > 0 {
		var err error
		if arena, err = d.allocLocked(usageUniform, uint64(len(params))); err != nil {
			return b.wrap(err, "params")
		}
		// The arena goes back to the pool right after the submit: queue
		// order makes the next batch's WriteBuffer land after this one ran.
		e.arena = arena
		var werr error
		ne := scoped(d.dev, func() { werr = d.queue.WriteBuffer(arena.raw, 0, params) })
		if ne == nil && werr != nil {
			ne = &nativeError{typ: errTypeValidation, msg: werr.Error()}
		}
		if ne != nil {
			return b.wrap(d.noteNative(ne), "params")
		}
	}
	var inner error
	ne := scoped(d.dev, func() { inner = b.encodeCmdsLocked(e, arena) })
	if inner != nil {
		return inner
	}
	if ne != nil {
		return b.wrap(d.noteNative(ne), "submit")
	}
	return nil
}

func (b *Batch) encodeCmdsLocked(out *Encoded, arena *Buffer) error {
	d := b.d
	defer d.bgs.releaseRetired() // after the pass ended: the finished command buffer keeps what it uses
	enc, err := d.dev.CreateCommandEncoder(nil)
	if err != nil {
		return b.wrap(fmt.Errorf("%w: %v", ErrValidation, err), "encode")
	}
	defer enc.Release()
	var timed *timedEncoder
	var whole *timedCopy // the batch timed as a whole (StartSubmitProfile)
	if d.prof != nil && d.prof.submits {
		whole = d.beginTimed(enc, kernelKey{kernel: "batch", batch: true})
		defer func() { // unless the encoded batch took its query set
			if whole != nil {
				whole.qs.Release()
			}
		}()
	} else if d.prof != nil {
		n := 0
		for _, c := range b.cmds {
			if c.pipe != nil {
				n++
			}
		}
		if timed, err = d.newTimedEncoder(n); err != nil {
			return b.wrap(err, "profile")
		}
		defer func() { // unless the encoded batch took its query set
			if timed != nil {
				timed.qs.Release()
			}
		}()
	}
	d.hazards(b.cmds)
	var pass *wgpu.ComputePassEncoder
	var passKernels []string
	endPass := func() error {
		if pass == nil {
			return nil
		}
		err := pass.End()
		pass.Release()
		pass = nil
		if err != nil {
			return &KernelError{Kernel: strings.Join(dedup(passKernels), ","), Op: "dispatch", Err: fmt.Errorf("%w: %v", ErrValidation, err)}
		}
		passKernels = passKernels[:0]
		return nil
	}
	for _, c := range b.cmds {
		if c.pipe == nil {
			if err := endPass(); err != nil {
				return err
			}
			if c.clear {
				err = enc.ClearBuffer(c.dst.buf.raw, c.dst.off, c.dst.size)
			} else {
				err = enc.CopyBufferToBuffer(c.src.buf.raw, c.src.off, c.dst.buf.raw, c.dst.off, c.src.size)
			}
			if err != nil {
				return b.wrap(fmt.Errorf("%w: %v", ErrValidation, err), "copy")
			}
			continue
		}
		e := c.pipe.e
		bg0, err := d.bindGroupLocked(e.layout, e.layout.group0, c.spans)
		if err != nil {
			return &KernelError{Kernel: e.name, Op: "bind", Err: err}
		}
		var bg1 *wgpu.BindGroup
		if e.params > 0 {
			bg1, err = d.bindGroupLocked(e.layout, e.layout.group1, []Span{{arena, 0, alignUp(uint64(e.params), 16)}})
			if err != nil {
				return &KernelError{Kernel: e.name, Op: "bind params", Err: err}
			}
		}
		if timed != nil { // a pass of its own, timed (profile.go)
			if err := endPass(); err != nil {
				return err
			}
			pass = timed.pass(d, enc, e.name, c.groups)
		}
		if pass == nil {
			pass = enc.BeginComputePass(nil)
		}
		passKernels = append(passKernels, e.name)
		pass.SetPipeline(e.pipe)
		pass.SetBindGroup(0, bg0, nil)
		if bg1 != nil {
			pass.SetBindGroup(1, bg1, []uint32{c.paramOff})
		}
		pass.DispatchWorkgroups(c.groups[0], c.groups[1], c.groups[2])
		d.tick++
		e.lastUse = d.tick
	}
	if err := endPass(); err != nil {
		return err
	}
	if whole != nil {
		out.prof = whole.end(d, enc) // which releases the query set if it fails
		whole = nil
	}
	if timed != nil {
		prof, err := timed.finish(d, enc)
		if err != nil {
			return b.wrap(err, "profile")
		}
		out.untimed = timed.untimed
		if prof != nil {
			out.prof = prof
			timed = nil
		}
	}
	cb, err := enc.Finish(nil)
	if err != nil {
		return b.wrap(fmt.Errorf("%w: %v", ErrValidation, err), "finish")
	}
	out.cb = cb
	return nil
}

// bindGroupLocked returns a cached bind group for these ranges under the
// given layout, creating it on a miss.
func (d *Device) bindGroupLocked(l *layoutEntry, bgl *wgpu.BindGroupLayout, spans []Span) (*wgpu.BindGroup, error) {
	if len(spans) > maxBindings {
		return nil, fmt.Errorf("%w: %d bindings (at most %d)", ErrValidation, len(spans), maxBindings)
	}
	key := bgKey{layout: l, n: uint8(len(spans))}
	if bgl == l.group1 {
		key.group = 1
	}
	for i, s := range spans {
		key.spans[i] = bgSpan{s.buf.id, s.off, s.size}
	}
	if bg := d.bgs.get(key); bg != nil {
		return bg, nil
	}
	ids := make([]uint64, len(spans))
	for i, s := range spans {
		ids[i] = s.buf.id
	}
	entries := make([]wgpu.BindGroupEntry, len(spans))
	for i, s := range spans {
		size := s.size
		if bgl == l.group0 {
			size = bindSize(s)
		}
		entries[i] = wgpu.BindGroupEntry{Binding: uint32(i), Buffer: s.buf.raw, Offset: s.off, Size: size}
	}
	bg, err := d.dev.CreateBindGroup(&wgpu.BindGroupDescriptor{Layout: bgl, Entries: entries})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrValidation, err)
	}
	d.bgs.put(key, bg, ids)
	return bg, nil
}

// wrap names the batch's kernels in err.
func (b *Batch) wrap(err error, op string) error { return wrapCmds(b.cmds, err, op) }

// wrapCmds names the kernels of cmds in err.
func wrapCmds(cmds []command, err error, op string) error {
	var names []string
	for _, c := range cmds {
		if c.pipe != nil {
			names = append(names, c.pipe.e.name)
		}
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: %w", op, err)
	}
	return &KernelError{Kernel: strings.Join(dedup(names), ","), Op: op, Err: err}
}

func dedup(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// Params builds a kernel's uniform block: 4-byte little-endian fields in
// declaration order (u32, i32 and f32 members of a WGSL struct).
type Params []byte

// U32 appends a u32 field.
func (p Params) U32(v uint32) Params { return binary.LittleEndian.AppendUint32(p, v) }

// I32 appends an i32 field.
func (p Params) I32(v int32) Params { return binary.LittleEndian.AppendUint32(p, uint32(v)) }

// F32 appends an f32 field.
func (p Params) F32(v float32) Params {
	return binary.LittleEndian.AppendUint32(p, math.Float32bits(v))
}
