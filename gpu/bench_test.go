package gpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/cogentcore/webgpu/wgpu"
	"github.com/rdrr/peer/gpu/q4k"
)

// BenchmarkGPU measures the runtime, in one run: the GPU's copy bandwidth
// first (the larger of the copy engine and a vec4 shader copy, counting
// bytes read plus bytes written), then host-to-GPU upload bandwidth for 64
// MiB uploads through the staging ring and through queue.WriteBuffer (as
// ratios of PCIe 5 x16, of the copy bandwidth and of the GPU copy from
// host memory alone, with where one upload's time goes), and uploads
// overlapping Q4_K kernels (transfer_bench_test.go). The kernels' own
// benchmark is gpu/ops's BenchmarkGPU. The shader copy and the Q4_K
// kernels come from the op library (link_test.go).
//
// RDRR_BENCH_UPLOAD_SWEEP=1 adds the upload chunk schedules and staging
// ring shapes.
//
// BENCHMARKS.md reports medians over repeated runs:
//
//	go test -run '^$' -bench . -benchtime 1x -count 5 ./gpu/ | sh gpu/bench-median.sh
func BenchmarkGPU(b *testing.B) {
	d, k := shared.d, shared.k
	m := &meter{d: d, k: k, cpu: d.Info().Type == "cpu"}
	// GPUs idle at a low clock and take a while under load to raise it:
	// run copies for a while before measuring anything.
	m.warm(b, 500*time.Millisecond)
	// -count N runs each sub-benchmark N times in a row (this body runs
	// once), so every repetition of "copy" measures again, and the ratios
	// below divide by the median of those measurements.
	var copies []float64
	b.Run("copy", func(b *testing.B) {
		c := m.copyBandwidth(b)
		copies = append(copies, c.best())
		b.ReportMetric(c.engine/1e9, "engine-GB/s")
		b.ReportMetric(c.shader/1e9, "shader-GB/s")
		b.ReportMetric(c.best()/1e9, "GB/s")
		b.Logf("%v: copy bandwidth %.1f GB/s (engine %.1f, shader %.1f), read+write bytes", d.Info(), c.best()/1e9, c.engine/1e9, c.shader/1e9)
	})
	ref := func(b *testing.B) float64 {
		if len(copies) == 0 { // -bench left "copy" out
			copies = append(copies, m.copyBandwidth(b).best())
		}
		return median(copies)
	}
	// Uploads: one 64 MiB upload, 16 back to back, queue.WriteBuffer, and
	// where a single upload's time goes (see uploadResult); uploads while
	// Q4_K kernels run. RDRR_BENCH_UPLOAD_SWEEP=1 adds the memcpy into mapped
	// memory alone, the chunk schedules and the staging ring's shapes.
	copyBW := func(b *testing.B) float64 {
		if m.cpu {
			return 0 // a CPU adapter's "copy" is a memcpy: no yardstick for uploads
		}
		return ref(b)
	}
	b.Run("upload/64MiB", func(b *testing.B) {
		// The kernel benchmarks leave a large heap behind: collect it now,
		// or the collector competes with the copy goroutines.
		runtime.GC()
		r := m.uploadPhases(b, 64<<20, true)
		r.report(b, copyBW(b))
		b.Logf("upload 64 MiB: staging %.1f GB/s (16 back to back: %.1f GB/s), queue.WriteBuffer %.2f GB/s; %d staging buffers of %d MiB, %d copy workers; one upload: %d chunks, call %v (memcpy %v, waits %v, submits %v), then sync %v",
			r.single/1e9, r.stream/1e9, r.written/1e9, d.opts.StagingBuffers, d.opts.StagingSize>>20, d.opts.CopyWorkers,
			r.phases.Chunks/max(1, r.phases.Uploads), r.call, r.phases.Copy/time.Duration(max(1, r.phases.Uploads)),
			r.phases.Wait/time.Duration(max(1, r.phases.Uploads)), r.phases.Submit/time.Duration(max(1, r.phases.Uploads)), r.sync)
	})
	b.Run("upload_overlap/q4k_group8", func(b *testing.B) { m.uploadOverlap(b, false) })
	b.Run("upload_overlap_host/q4k_group8", func(b *testing.B) { m.uploadOverlap(b, true) })
	if os.Getenv("RDRR_BENCH_UPLOAD_SWEEP") == "1" {
		b.Run("memcpy_mapped/64MiB", func(b *testing.B) { m.memcpyMapped(b, 64<<20) })
		m.uploadModes(b, copyBW)
		m.uploadSweep(b, copyBW)
	}
}

// pcie5x16 is the data-sheet limit of a PCIe 5 x16 link, 64 GB/s each
// way: the ceiling of host-to-GPU uploads on the H100 (the measured copy
// baseline of this benchmark is GPU-internal and says nothing of the link).
const pcie5x16 = 64e9

// median returns the median of xs (the mean of the middle two when their
// number is even); it sorts a copy.
func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// maxReps bounds the dispatches per timed batch.
const maxReps = 256

type meter struct {
	d   *Device
	k   OpKernels
	cpu bool // a CPU adapter (lavapipe): fewer repeats, smaller rotation
}

type copyResult struct{ engine, shader float64 }

func (c copyResult) best() float64 { return max(c.engine, c.shader) }

func (m *meter) alloc(b *testing.B, n uint64) *Buffer {
	buf, err := m.d.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(buf.Release)
	return buf
}

// fill uploads pseudo-random bytes (a fixed pattern, cheap to make) so that
// no kernel runs on zeros.
func (m *meter) fill(b *testing.B, buf *Buffer, n uint64) {
	src := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := 0; i+8 <= len(src); i += 8 {
		binary.LittleEndian.PutUint64(src[i:], r.Uint64()&0x3f3f3f3f3f3f3f3f) // finite floats, small halves
	}
	if err := m.d.Upload(context.Background(), buf, src); err != nil {
		b.Fatal(err)
	}
}

// timeDispatches returns the GPU time of one recorded unit of work. It
// records reps units per batch, pipelines several batches (the GPU runs one
// while the CPU encodes the next) and takes the slope between 2 and 6
// batches, which cancels submit and sync latency; the median of 5 trials.
func (m *meter) timeDispatches(b *testing.B, record func(bt *Batch, i int) error) time.Duration {
	ctx := context.Background()
	runBatches := func(nb, reps int) time.Duration {
		start := time.Now()
		for j := 0; j < nb; j++ {
			bt := m.d.Batch()
			for i := 0; i < reps; i++ {
				if err := record(bt, j*reps+i); err != nil {
					b.Fatal(err)
				}
			}
			if err := bt.Submit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if err := m.d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	runBatches(1, 1) // compile, bind groups
	// Size batches to ~3 ms of GPU work (30 ms on a CPU adapter), then keep
	// the GPU busy for a while (clocks, caches) before timing.
	target := 3 * time.Millisecond
	warm := 40 * time.Millisecond
	lo, hi := 2, 8
	if m.cpu {
		target, warm, lo, hi = 30*time.Millisecond, 0, 1, 2
	}
	reps := 1
	for reps < maxReps {
		if t := runBatches(2, reps) / 2; t >= target {
			break
		}
		reps *= 2
	}
	for start := time.Now(); time.Since(start) < warm; {
		runBatches(2, reps)
	}
	var ts []time.Duration
	for trial := 0; trial < 5; trial++ {
		t1 := runBatches(lo, reps)
		t2 := runBatches(hi, reps)
		per := (t2 - t1) / time.Duration((hi-lo)*reps)
		if per <= 0 {
			per = t2 / time.Duration(hi*reps)
		}
		ts = append(ts, per)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	return ts[len(ts)/2]
}

// warm keeps the GPU copying for about dur.
func (m *meter) warm(b *testing.B, dur time.Duration) {
	if m.cpu {
		return
	}
	ctx := context.Background()
	n := uint64(64 << 20)
	src, dst := m.alloc(b, n), m.alloc(b, n)
	for start := time.Now(); time.Since(start) < dur; {
		bt := m.d.Batch()
		for i := 0; i < 16; i++ {
			if err := m.k.CopyKernel(ctx, bt, src, dst, int(n)); err != nil {
				b.Fatal(err)
			}
		}
		if err := bt.Submit(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func (m *meter) copyBandwidth(b *testing.B) copyResult {
	n := uint64(256 << 20)
	if m.cpu {
		n = 32 << 20
	}
	n = min(n, m.d.limits.MaxStorageBufferBindingSize/16*16)
	src, dst := m.alloc(b, n), m.alloc(b, n)
	m.fill(b, src, n)
	eng := m.timeDispatches(b, func(bt *Batch, i int) error { return bt.Copy(dst, src) })
	sh := m.timeDispatches(b, func(bt *Batch, i int) error {
		return m.k.CopyKernel(context.Background(), bt, src, dst, int(n))
	})
	bytes := float64(2 * n)
	return copyResult{engine: bytes / eng.Seconds(), shader: bytes / sh.Seconds()}
}

// outputs returns maxReps output buffers: every dispatch of a batch writes
// its own, since wgpu puts a pipeline barrier (which drains the GPU) before
// a dispatch that writes a buffer an earlier dispatch of the batch wrote.
func (m *meter) outputs(b *testing.B, n uint64) []*Buffer {
	ys := make([]*Buffer, maxReps)
	for i := range ys {
		ys[i] = m.alloc(b, n)
	}
	return ys
}

// benchQ4K makes realistic blocks (small d and dmin, random quants).
func benchQ4K(nblocks int) []byte {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]byte, nblocks*q4k.BlockBytes)
	for i := 0; i+8 <= len(out); i += 8 {
		binary.LittleEndian.PutUint64(out[i:], r.Uint64())
	}
	d, dm := q4k.ToF16(0.004), q4k.ToF16(0.01)
	for b := 0; b < nblocks; b++ {
		binary.LittleEndian.PutUint16(out[b*q4k.BlockBytes:], d)
		binary.LittleEndian.PutUint16(out[b*q4k.BlockBytes+2:], dm)
	}
	return out
}

// memcpyMapped times the CPU side of the staging path alone: copying n
// bytes into a mapped staging buffer with 1 to 16 goroutines, and into
// ordinary memory for comparison.
func (m *meter) memcpyMapped(b *testing.B, n int) {
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i * 7)
	}
	m.d.mu.Lock()
	raw, err := m.d.dev.CreateBuffer(&wgpu.BufferDescriptor{Size: uint64(n), Usage: wgpu.BufferUsageMapWrite | wgpu.BufferUsageCopySrc, MappedAtCreation: true})
	m.d.mu.Unlock()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { raw.Unmap(); raw.Destroy(); raw.Release() }()
	mapped := raw.GetMappedRange(0, uint(n))
	plain := make([]byte, n)
	for _, w := range []int{1, 4, 8, 16} {
		for _, dst := range []struct {
			name string
			p    []byte
		}{{"mapped", mapped}, {"plain", plain}} {
			best := time.Duration(1 << 62)
			for i := 0; i < 3; i++ {
				start := time.Now()
				parallelCopy(dst.p, src, w)
				best = min(best, time.Since(start))
			}
			b.ReportMetric(float64(n)/best.Seconds()/1e9, fmt.Sprintf("%s-w%d-GB/s", dst.name, w))
		}
	}
}
