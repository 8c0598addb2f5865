package gpu

import (
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

type usage uint8

const (
	usageStorage  usage = iota // kernels read and write it; copies in and out
	usageUniform               // kernel parameters
	usageReadback              // mapped for reading
	usageQuery                 // timestamp queries resolved into it (profile.go)
)

func (u usage) flags() wgpu.BufferUsage {
	switch u {
	case usageUniform:
		return wgpu.BufferUsageUniform | wgpu.BufferUsageCopyDst
	case usageReadback:
		return wgpu.BufferUsageMapRead | wgpu.BufferUsageCopyDst
	case usageQuery:
		return wgpu.BufferUsageQueryResolve | wgpu.BufferUsageCopySrc
	}
	return wgpu.BufferUsageStorage | wgpu.BufferUsageCopySrc | wgpu.BufferUsageCopyDst
}

type bufState uint8

const (
	bufLive      bufState = iota // handed out
	bufPooled                    // released, waiting for reuse
	bufDestroyed                 // native buffer destroyed
)

// Buffer is device memory. Its contents are undefined after Alloc (a pooled
// buffer keeps whatever it held). Release hands it back; using it after
// Release is an error that Batch.Submit reports.
type Buffer struct {
	d     *Device
	id    uint64
	raw   *wgpu.Buffer
	size  uint64 // bytes asked for
	cap   uint64 // bytes allocated (size class)
	use   usage
	state bufState // guarded by d.mu
	// hazard is its use in the batch being encoded (hazard.go), guarded
	// by d.mu.
	hazard hazard
}

// Size is the size asked for at Alloc.
func (b *Buffer) Size() uint64 { return b.size }

// Region is a byte range of a buffer: a *Buffer (all of it) or a Span.
type Region interface{ span() Span }

// Span is a byte range of a buffer.
type Span struct {
	buf       *Buffer
	off, size uint64
}

func (b *Buffer) span() Span { return Span{b, 0, b.size} }
func (s Span) span() Span    { return s }

// SpanOf returns the byte range r stands for (the zero Span for nil): what
// an op library checks a binding's size against.
func SpanOf(r Region) Span {
	if r == nil {
		return Span{}
	}
	return r.span()
}

// Sub returns the range [off, off+size) of b. Ranges outside b are
// reported when used.
func (b *Buffer) Sub(off, size uint64) Span { return Span{b, off, size} }

// Buffer, Offset and Size describe the range.
func (s Span) Buffer() *Buffer { return s.buf }
func (s Span) Offset() uint64  { return s.off }
func (s Span) Size() uint64    { return s.size }

func (s Span) String() string {
	if s.buf == nil {
		return "span(nil)"
	}
	return fmt.Sprintf("buffer %d [%d, %d)", s.buf.id, s.off, s.off+s.size)
}

// Alloc returns a storage buffer of at least size bytes, reusing a pooled
// one of the same size class when it can.
func (d *Device) Alloc(size uint64) (*Buffer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.usable(); err != nil {
		return nil, err
	}
	d.drainLocked()
	return d.allocLocked(usageStorage, size)
}

func (d *Device) allocLocked(u usage, size uint64) (*Buffer, error) {
	if size == 0 {
		size = 4
	}
	if size > d.limits.MaxBufferSize {
		return nil, fmt.Errorf("%w: buffer of %d bytes; the device's max buffer size is %d (Options.MaxBufferSize; the adapter offers %d)",
			ErrLimit, size, d.limits.MaxBufferSize, d.adapterMaxBuffer())
	}
	class := min(sizeClass(size), alignUp(d.limits.MaxBufferSize-3, 4))
	class = max(class, alignUp(size, 4))
	if b := d.pool.take(u, class); b != nil {
		b.size = size
		b.state = bufLive
		d.counters.reuses++
		return b, nil
	}
	var raw *wgpu.Buffer
	var cerr error
	ne := scoped(d.dev, func() {
		raw, cerr = d.dev.CreateBuffer(&wgpu.BufferDescriptor{Size: class, Usage: u.flags()})
	})
	if ne == nil && cerr != nil {
		ne = &nativeError{typ: errTypeValidation, msg: cerr.Error()}
	}
	if ne != nil {
		if raw != nil {
			raw.Release()
		}
		// A failed allocation may succeed once idle pooled memory is freed.
		if ne.typ == errTypeOutOfMemory && d.pool.count > 0 {
			d.pool.trim(d, 0)
			return d.allocLocked(u, size)
		}
		return nil, fmt.Errorf("allocate %d bytes: %w", size, d.noteNative(ne))
	}
	d.nextID++
	b := &Buffer{d: d, id: d.nextID, raw: raw, size: size, cap: class, use: u}
	d.buffers[b.id] = b
	d.counters.allocs++
	return b, nil
}

func (d *Device) adapterMaxBuffer() uint64 {
	return d.adapter.GetLimits().Limits.MaxBufferSize
}

// Release hands b back to the pool (or frees it when the pool is full).
// Work already submitted that uses b still sees it; b must not be used in
// batches submitted afterwards. Release is idempotent.
func (b *Buffer) Release() {
	if b == nil {
		return
	}
	d := b.d
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releaseLocked(b)
}

func (d *Device) releaseLocked(b *Buffer) {
	if b.state != bufLive {
		return
	}
	if d.closed || d.pool.limit < 0 || int64(b.cap) > d.pool.limit {
		b.destroyLocked()
		return
	}
	d.pool.put(b)
	d.pool.trim(d, d.pool.limit)
}

func (b *Buffer) destroyLocked() {
	if b.state == bufDestroyed {
		return
	}
	b.state = bufDestroyed
	b.d.bgs.forget(b.id)
	delete(b.d.buffers, b.id)
	b.raw.Destroy()
	b.raw.Release()
}

// sizeClass rounds n up to one of four classes per power of two (at most
// 25% waste), with 256 bytes as the smallest class.
func sizeClass(n uint64) uint64 {
	if n <= 256 {
		return 256
	}
	p := bits.Len64(n - 1) // 2^p >= n > 2^(p-1)
	step := uint64(1) << (p - 3)
	return (n + step - 1) / step * step
}

func alignUp(n, a uint64) uint64 { return (n + a - 1) / a * a }

// pool keeps released buffers by (usage, size class), oldest evicted first.
type pool struct {
	free  map[poolKey][]*Buffer
	order []*Buffer // pooled buffers, oldest first
	idle  int64
	count int
	limit int64
}

type poolKey struct {
	use   usage
	class uint64
}

func (p *pool) put(b *Buffer) {
	if p.free == nil {
		p.free = map[poolKey][]*Buffer{}
	}
	k := poolKey{b.use, b.cap}
	p.free[k] = append(p.free[k], b)
	p.order = append(p.order, b)
	b.state = bufPooled
	p.idle += int64(b.cap)
	p.count++
}

func (p *pool) take(u usage, class uint64) *Buffer {
	k := poolKey{u, class}
	list := p.free[k]
	if len(list) == 0 {
		return nil
	}
	b := list[len(list)-1]
	p.free[k] = list[:len(list)-1]
	p.remove(b)
	return b
}

func (p *pool) remove(b *Buffer) {
	for i, o := range p.order {
		if o == b {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
	p.idle -= int64(b.cap)
	p.count--
}

// trim destroys the oldest pooled buffers until at most limit bytes idle.
func (p *pool) trim(d *Device, limit int64) {
	for p.idle > limit && len(p.order) > 0 {
		b := p.order[0]
		k := poolKey{b.use, b.cap}
		list := p.free[k]
		for i, o := range list {
			if o == b {
				p.free[k] = append(list[:i], list[i+1:]...)
				break
			}
		}
		p.remove(b)
		b.destroyLocked()
	}
}

// TrimPool frees every pooled buffer.
func (d *Device) TrimPool() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.drainLocked()
	d.pool.trim(d, 0)
}

// bindGroupCache reuses bind groups by (layout, buffer ranges). Entries that
// name a destroyed buffer are dropped; the cache is cleared when full. A
// clear while a batch is being encoded must not release the groups that
// batch's open compute pass has already set (wgpu then panics at the
// pass's end: "BindGroup does not exist", seen on the H100 after a few
// thousand distinct arena slots): they are retired, and released once the
// encoding is over (releaseRetired; wgpu keeps what a submission uses).
type bindGroupCache struct {
	m       map[bgKey]*wgpu.BindGroup
	byBuf   map[uint64][]bgKey
	limit   int
	retired []*wgpu.BindGroup
}

// bgKey names a bind group: its layout, the group, and the buffer ranges
// bound. A comparable struct, so a lookup (every dispatch) allocates
// nothing.
type bgKey struct {
	layout *layoutEntry
	group  uint8
	n      uint8
	spans  [maxBindings]bgSpan
}

type bgSpan struct{ id, off, size uint64 }

// maxBindings bounds a kernel's storage bindings (layoutLocked refuses
// more).
const maxBindings = 8

// releaseRetired releases the groups that a clear retired.
func (c *bindGroupCache) releaseRetired() {
	for _, bg := range c.retired {
		bg.Release()
	}
	c.retired = nil
}

func (c *bindGroupCache) get(key bgKey) *wgpu.BindGroup { return c.m[key] }

func (c *bindGroupCache) put(key bgKey, bg *wgpu.BindGroup, bufs []uint64) {
	if c.m == nil {
		c.m = map[bgKey]*wgpu.BindGroup{}
		c.byBuf = map[uint64][]bgKey{}
	}
	if len(c.m) >= c.limit {
		for _, bg := range c.m {
			c.retired = append(c.retired, bg)
		}
		c.m = map[bgKey]*wgpu.BindGroup{}
		c.byBuf = map[uint64][]bgKey{}
	}
	c.m[key] = bg
	for _, id := range bufs {
		c.byBuf[id] = append(c.byBuf[id], key)
	}
}

func (c *bindGroupCache) forget(id uint64) {
	for _, k := range c.byBuf[id] {
		if bg, ok := c.m[k]; ok {
			bg.Release()
			delete(c.m, k)
		}
	}
	delete(c.byBuf, id)
}

func (c *bindGroupCache) clear() {
	for _, bg := range c.m {
		bg.Release()
	}
	c.m = nil
	c.byBuf = nil
	c.releaseRetired()
}

// Bytes views a slice of fixed-size numbers as its bytes (no copy), for
// Upload, Write and Read.
func Bytes[T ~float32 | ~uint32 | ~int32 | ~uint16 | ~uint8](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}
