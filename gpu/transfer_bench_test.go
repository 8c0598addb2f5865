package gpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/cogentcore/webgpu/wgpu"
)

// uploadResult is one configuration's upload measurements.
type uploadResult struct {
	single, stream, written float64 // bytes/s: one Upload+Sync, 16 back to back, queue.WriteBuffer
	dma, dmaStream          float64 // bytes/s of the GPU copy alone from host-visible memory: one, 8 back to back
	// Per single upload (mean over the timed ones): where the time went.
	call   time.Duration // Upload until it returned
	sync   time.Duration // Sync after it
	phases uploadSnapshot
}

// report writes r's metrics; copyBW is the GPU copy bandwidth of the run
// (0: not measured).
func (r uploadResult) report(b *testing.B, copyBW float64) {
	b.ReportMetric(r.single/1e9, "GB/s")
	b.ReportMetric(r.stream/1e9, "stream-GB/s")
	b.ReportMetric(r.single/pcie5x16, "x-of-pcie5x16")
	b.ReportMetric(r.stream/pcie5x16, "stream-x-of-pcie5x16")
	if copyBW > 0 {
		// As the kernels count it: the bytes that reach VRAM over the
		// copy bandwidth (which PCIe leaves far behind: ~0.01-0.02).
		b.ReportMetric(r.single/copyBW, "x-of-copy")
	}
	if r.dma > 0 {
		// The ceiling of the staging path on this device: the GPU copy
		// from host-visible memory with no memcpy, map or poll around it.
		b.ReportMetric(r.dma/1e9, "dma-GB/s")
		b.ReportMetric(r.dmaStream/1e9, "dma-stream-GB/s")
		b.ReportMetric(r.single/r.dma, "x-of-dma")
		b.ReportMetric(r.stream/r.dmaStream, "stream-x-of-dma")
	}
	if r.written > 0 {
		b.ReportMetric(r.written/1e9, "writebuffer-GB/s")
		b.ReportMetric(r.single/r.written, "x-of-writebuffer")
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	p := r.phases
	if p.Uploads > 0 {
		n := time.Duration(p.Uploads)
		b.ReportMetric(us(r.call), "call-us")
		b.ReportMetric(us(r.sync), "sync-us")
		b.ReportMetric(float64(p.Chunks)/float64(p.Uploads), "chunks")
		b.ReportMetric(us(p.Wait/n), "wait-us")
		b.ReportMetric(us(p.Copy/n), "memcpy-us")
		b.ReportMetric(us(p.Submit/n), "submit-us")
		if p.Chunks > 0 {
			b.ReportMetric(us(p.Turn/time.Duration(p.Chunks)), "turn-us/chunk")
		}
	}
}

// uploadPhases measures n-byte uploads: one Upload then Sync (median of
// 5, with the phase times of those 5), 16 back to back then one Sync
// (median of 5), and, if writeBuffer, queue.WriteBuffer.
func (m *meter) uploadPhases(b *testing.B, n int, writeBuffer bool) uploadResult {
	ctx := context.Background()
	src := make([]byte, n)
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(src[i:], r.Uint64())
	}
	dsts := make([]*Buffer, 4)
	for i := range dsts {
		dsts[i] = m.alloc(b, uint64(n))
	}
	up := func(i int) {
		if err := m.d.Upload(ctx, dsts[i%4], src); err != nil {
			b.Fatal(err)
		}
	}
	sync := func() {
		if err := m.d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// Warm the staging ring and the destinations (page faults, lazily
	// allocated memory); then let the ring's buffers come back so that the
	// timed single uploads find it idle, as a lone upload does.
	for i := range dsts {
		up(i)
	}
	sync()
	m.d.mu.Lock()
	st := m.d.stager
	m.d.mu.Unlock()
	idle := func() {
		for i := 0; len(st.free) != cap(st.free) && i < 10000; i++ {
			m.d.wake()
			time.Sleep(20 * time.Microsecond)
		}
	}
	idle()
	var res uploadResult
	var singles []time.Duration
	before := m.d.uploadStats()
	for i := 0; i < 5; i++ {
		start := time.Now()
		up(i)
		called := time.Now()
		sync()
		done := time.Now()
		singles = append(singles, done.Sub(start))
		res.call += called.Sub(start) / 5
		res.sync += done.Sub(called) / 5
		idle()
	}
	res.phases = m.d.uploadStats().sub(before)
	res.single = float64(n) / medianDuration(singles).Seconds()
	const burst = 16
	var streams []time.Duration
	for i := 0; i < 5; i++ {
		start := time.Now()
		for j := 0; j < burst; j++ {
			up(j)
		}
		sync()
		streams = append(streams, time.Since(start)/burst)
	}
	res.stream = float64(n) / medianDuration(streams).Seconds()
	res.dma, res.dmaStream = m.dmaOnly(b, dsts, n)
	if writeBuffer {
		var ws []time.Duration
		for i := 0; i < 5; i++ {
			start := time.Now()
			if err := m.d.Write(dsts[i%4], src); err != nil {
				b.Fatal(err)
			}
			sync()
			ws = append(ws, time.Since(start))
		}
		res.written = float64(n) / medianDuration(ws).Seconds()
	}
	return res
}

// dmaOnly times the GPU copy of n bytes from a host-visible staging-like
// buffer (MAP_WRITE | COPY_SRC, filled once and left unmapped) into dsts:
// one copy then Sync, and 8 back to back then Sync; medians of 5.
func (m *meter) dmaOnly(b *testing.B, dsts []*Buffer, n int) (single, stream float64) {
	ctx := context.Background()
	d := m.d
	d.mu.Lock()
	raw, err := d.dev.CreateBuffer(&wgpu.BufferDescriptor{Label: "dma-probe", Size: uint64(n), Usage: wgpu.BufferUsageMapWrite | wgpu.BufferUsageCopySrc, MappedAtCreation: true})
	if err == nil {
		parallelCopy(raw.GetMappedRange(0, uint(n)), make([]byte, n), d.opts.CopyWorkers)
		raw.Unmap()
	}
	d.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { d.mu.Lock(); raw.Destroy(); raw.Release(); d.mu.Unlock() }()
	copies := func(k int) time.Duration {
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for i := 0; i < k; i++ {
			d.mu.Lock()
			idx, ne := d.copyLocked("copy", raw, 0, dsts[i%len(dsts)].raw, 0, uint64(n))
			d.mu.Unlock()
			if ne != nil {
				b.Fatal(d.noteNative(ne))
			}
			d.noteSubmit(idx)
		}
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	copies(1)
	var ones, eights []time.Duration
	for i := 0; i < 5; i++ {
		ones = append(ones, copies(1))
		eights = append(eights, copies(8)/8)
	}
	return float64(n) / medianDuration(ones).Seconds(), float64(n) / medianDuration(eights).Seconds()
}

func medianDuration(ts []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ts...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// uploadModes compares Upload's chunk schedules on this device: whole
// staging buffers or a ramp from small chunks on an idle ring, submitted
// by the caller or by a submitter goroutine.
func (m *meter) uploadModes(b *testing.B, copyBW func(*testing.B) float64) {
	for _, mode := range []struct {
		name      string
		ramp      uint64
		pipelined bool
	}{{"whole-caller", 0, false}, {"whole-pipelined", 0, true}, {"ramp-caller", rampStart, false}, {"ramp-pipelined", rampStart, true}} {
		b.Run("upload_mode/"+mode.name, func(b *testing.B) {
			if err := m.d.setUploadMode(mode.ramp, mode.pipelined); err != nil {
				b.Fatal(err)
			}
			defer m.d.setUploadMode(rampStart, true)
			m.uploadPhases(b, 64<<20, false).report(b, copyBW(b))
		})
	}
}

// uploadOverlap measures uploads while kernels run: 8 uploads of 64 MiB
// alone, Q4_K expert products (8 DeepSeek-shaped 7168x2048 experts per
// dispatch, as an MoE layer runs them) alone for about as long, then both
// at once from two goroutines. x-of-serial is the time of both over the
// sum of the two alone: 1 means the GPU ran them one after the other,
// max/sum (reported as best-x-of-serial) that it hid the shorter entirely.
// With host, the uploads are CopyHost copies from a sealed host buffer
// (the pinned RAM level's path: one DMA each, no memcpy into staging).
func (m *meter) uploadOverlap(b *testing.B, host bool) {
	ctx := context.Background()
	n, uploads := 64<<20, 8
	rows, cols, e := 7168, 2048, 8
	if m.cpu {
		n, uploads, rows, cols, e = 4<<20, 4, 512, 512, 4
	}
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 31)
	}
	dsts := make([]*Buffer, 2)
	for i := range dsts {
		dsts[i] = m.alloc(b, uint64(n))
	}
	var hb *HostBuffer
	if host {
		var err error
		if hb, err = m.d.AllocHost(uint64(n)); err != nil {
			b.Fatal(err)
		}
		defer hb.Release()
		copy(hb.Bytes(), src)
		if err := hb.Seal(); err != nil {
			b.Fatal(err)
		}
	}
	wBytes := Q4K.Bytes(rows * cols)
	nslots := int(min(15, (128<<20)/wBytes))
	blocks := benchQ4K(rows * cols / 256)
	var arenas [2]*Buffer
	for i := range arenas {
		arenas[i] = m.alloc(b, uint64(nslots)*wBytes)
		for s := range nslots {
			if err := m.d.Upload(ctx, arenas[i].Sub(uint64(s)*wBytes, wBytes), blocks); err != nil {
				b.Fatal(err)
			}
		}
	}
	x := m.alloc(b, uint64(cols*4))
	m.fill(b, x, uint64(cols*4))
	ys := m.outputs(b, uint64(e*rows*4))
	slots := func(i int) []int {
		out := make([]int, e)
		for j := range out {
			out[j] = (i*e + j) % nslots
		}
		return out
	}
	const perBatch = 16
	kernels := func(batches int) {
		for j := 0; j < batches; j++ {
			bt := m.d.Batch()
			for i := 0; i < perBatch; i++ {
				k := j*perBatch + i
				if err := m.k.Q4KMatVecGroup(ctx, bt, arenas[k%2], slots(k), x, true, ys[k%len(ys)], rows, cols); err != nil {
					b.Fatal(err)
				}
			}
			if err := bt.Submit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	ups := func() {
		for i := 0; i < uploads; i++ {
			var err error
			if host {
				err = m.d.CopyHost(ctx, dsts[i%2], hb, 0, uint64(n))
			} else {
				err = m.d.Upload(ctx, dsts[i%2], src)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	timed := func(f func()) time.Duration {
		if err := m.d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		f()
		if err := m.d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	timed(func() { kernels(1); ups() }) // compile, bind groups, staging
	tU := timed(ups)
	tK1 := timed(func() { kernels(1) })
	batches := int(max(1, min(64, tU/max(tK1, time.Microsecond))))
	var tUs, tKs, tBoth []time.Duration
	for trial := 0; trial < 3; trial++ {
		tUs = append(tUs, timed(ups))
		tKs = append(tKs, timed(func() { kernels(batches) }))
		tBoth = append(tBoth, timed(func() {
			done := make(chan struct{})
			go func() { defer close(done); kernels(batches) }()
			ups()
			<-done
		}))
	}
	u, k, both := medianDuration(tUs), medianDuration(tKs), medianDuration(tBoth)
	b.ReportMetric(float64(uploads*n)/u.Seconds()/1e9, "alone-GB/s")
	b.ReportMetric(float64(uploads*n)/both.Seconds()/1e9, "with-kernels-GB/s")
	b.ReportMetric(float64(u.Microseconds())/1e3, "uploads-ms")
	b.ReportMetric(float64(k.Microseconds())/1e3, "kernels-ms")
	b.ReportMetric(float64(both.Microseconds())/1e3, "both-ms")
	b.ReportMetric(both.Seconds()/(u+k).Seconds(), "x-of-serial")
	b.ReportMetric(max(u, k).Seconds()/(u+k).Seconds(), "best-x-of-serial")
	b.Logf("upload overlap: %d x %d MiB uploads %v alone, %d batches of %d Q4_K groups (%d x %dx%d) %v alone, both %v",
		uploads, n>>20, u, batches, perBatch, e, rows, cols, k, both)
}

// uploadSweep times the staging ring's shapes (buffers x size, copy
// goroutines), each on a device of its own, in the default chunk schedule.
func (m *meter) uploadSweep(b *testing.B, copyBW func(*testing.B) float64) {
	for _, st := range [][3]int{{4, 8, 16}, {4, 16, 16}, {8, 16, 16}, {2, 32, 16}, {8, 8, 16}, {12, 8, 16}, {16, 8, 16}, {8, 4, 16}, {16, 4, 16}, {8, 8, 8}, {4, 16, 8}} {
		b.Run(fmt.Sprintf("upload_sweep/%dx%dMiB-w%d", st[0], st[1], st[2]), func(b *testing.B) {
			o := testOptions()
			o.StagingBuffers, o.StagingSize, o.CopyWorkers = st[0], uint64(st[1])<<20, st[2]
			d2, err := Open(context.Background(), o)
			if err != nil {
				b.Fatal(err)
			}
			defer d2.Close()
			m2 := &meter{d: d2, k: NewKernels(d2), cpu: m.cpu}
			defer m2.k.Close()
			m2.uploadPhases(b, 64<<20, false).report(b, copyBW(b))
		})
	}
}
