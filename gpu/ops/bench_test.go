package ops

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/q4k"
)

// BenchmarkGPU measures the built-in kernels, in one run: the GPU's copy
// bandwidth first (the larger of the copy engine and a vec4 shader copy,
// counting bytes read plus bytes written), then every kernel's effective
// bandwidth (the least bytes it must read and write, over its time) as a
// ratio of that copy bandwidth (x-of-copy). The runtime's own benchmark
// (gpu.BenchmarkGPU: copy bandwidth and uploads) is in gpu/.
//
// Kernels are timed back to back in batches, with weights rotated over
// buffers larger than the GPU's L2 so that repeats read memory, not cache.
// "x-of-copy" runs independent dispatches (distinct outputs: the GPU may
// overlap one dispatch's tail with the next one's start, as independent
// expert products in a decode step do); "x-of-copy-serial" makes each
// dispatch wait for the previous one (same output buffer: wgpu puts a
// barrier between them).
//
// RDRR_BENCH_SWEEP=1 also times Q4_K configurations (the sweep that chose
// DefaultQ4KConfig); RDRR_BENCH_PROBES=1 adds the memory-only probes of
// testdata/q4k_probe.wgsl.
//
// gpu/BENCHMARKS.md reports medians over repeated runs:
//
//	go test -run '^$' -bench . -benchtime 1x -count 5 ./gpu/ops/ | sh gpu/bench-median.sh
func BenchmarkGPU(b *testing.B) {
	m := newMeter(b)
	d := m.d
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
	report := func(b *testing.B, r result) {
		b.ReportMetric(r.bw/1e9, "GB/s")
		b.ReportMetric(r.bw/ref(b), "x-of-copy")
		if r.serial > 0 {
			b.ReportMetric(r.serial/ref(b), "x-of-copy-serial")
		}
		b.ReportMetric(float64(r.per.Nanoseconds())/1e3, "us/dispatch")
	}

	sweep := os.Getenv("RDRR_BENCH_SWEEP") == "1"
	for _, s := range [][2]int{{4096, 14336}, {14336, 4096}, {7168, 2048}, {2048, 7168}} {
		rows, cols := s[0], s[1]
		b.Run(fmt.Sprintf("q4k_matvec/%dx%d", rows, cols), func(b *testing.B) {
			report(b, m.q4kMatVec(b, rows, cols, 1, DefaultQ4KConfig(rows, cols, 1)))
		})
		// The same products as an MoE layer runs them: 8 experts' products
		// in one dispatch (down projections read each expert's own x;
		// gate and up share the layer's x).
		b.Run(fmt.Sprintf("q4k_matvec_group8/%dx%d", rows, cols), func(b *testing.B) {
			report(b, m.q4kGroup(b, rows, cols, 8, rows < cols, DefaultQ4KConfig(8*rows, cols, 1)))
		})
		// The throughput-tuned alternative (see DefaultQ4KConfig).
		alt := Q4KConfig{WG: 64, SPR: 2, Rows: 8, Pipeline: true}
		b.Run(fmt.Sprintf("q4k_matvec_spr2/%dx%d", rows, cols), func(b *testing.B) {
			report(b, m.q4kMatVec(b, rows, cols, 1, alt))
		})
		if sweep {
			if os.Getenv("RDRR_BENCH_PROBES") == "1" {
				for _, cfg := range []Q4KConfig{{SPR: 16, Rows: 4}, {SPR: 32, Rows: 4}} {
					for _, mode := range []int{0, 1, 4} {
						b.Run(fmt.Sprintf("q4k_probe%d/%dx%d/spr%d-rows%d", mode, rows, cols, cfg.SPR, cfg.Rows), func(b *testing.B) {
							report(b, m.q4kProbe(b, rows, cols, mode, cfg))
						})
					}
					b.Run(fmt.Sprintf("q4k_mathonly/%dx%d/spr%d-rows%d", rows, cols, cfg.SPR, cfg.Rows), func(b *testing.B) {
						report(b, m.q4kMathOnly(b, rows, cols, cfg))
					})
				}
			}
			for _, wg := range []int{64, 128, 256} {
				for _, spr := range []int{1, 2, 4, 8} {
					for _, rw := range []int{2, 4, 8} {
						cfg := Q4KConfig{SPR: spr, Rows: rw, WG: wg, Pipeline: true}
						b.Run(fmt.Sprintf("q4k_group8_sweep/%dx%d/wg%d-spr%d-rows%d", rows, cols, wg, spr, rw), func(b *testing.B) {
							report(b, m.q4kGroup(b, rows, cols, 8, rows < cols, cfg))
						})
					}
				}
			}
			for _, wg := range []int{64, 128, 256} {
				for _, spr := range []int{1, 2, 4, 8} {
					for _, rw := range []int{1, 2, 4, 8} {
						for _, pipe := range []bool{false, true} {
							cfg := Q4KConfig{SPR: spr, Rows: rw, WG: wg, Pipeline: pipe}
							b.Run(fmt.Sprintf("q4k_sweep/%dx%d/wg%d-spr%d-rows%d-pipe%v", rows, cols, wg, spr, rw, pipe), func(b *testing.B) {
								report(b, m.q4kMatVec(b, rows, cols, 1, cfg))
							})
						}
					}
				}
			}
		}
	}
	b.Run("q4k_matmul/4096x4096/n8", func(b *testing.B) {
		report(b, m.q4kMatVec(b, 4096, 4096, 8, DefaultQ4KConfig(4096, 4096, 8)))
	})
	b.Run("q4k_dequant_f32/4096x4096", func(b *testing.B) { report(b, m.dequant(b, 4096*4096, abi.F32)) })
	b.Run("q4k_dequant_f16/4096x4096", func(b *testing.B) { report(b, m.dequant(b, 4096*4096, abi.F16)) })
	b.Run("f16_matvec/4096x14336", func(b *testing.B) { report(b, m.dense(b, abi.F16, 4096, 14336, 1)) })
	b.Run("f32_matvec/4096x4096", func(b *testing.B) { report(b, m.dense(b, abi.F32, 4096, 4096, 1)) })
	b.Run("f16_matmul/4096x4096/n8", func(b *testing.B) { report(b, m.dense(b, abi.F16, 4096, 4096, 8)) })
	b.Run("rmsnorm/4096x4096", func(b *testing.B) { report(b, m.rows(b, "rmsnorm", 4096, 4096)) })
	b.Run("softmax/4096x4096", func(b *testing.B) { report(b, m.rows(b, "softmax", 4096, 4096)) })
	b.Run("swiglu/16M", func(b *testing.B) { report(b, m.rows(b, "swiglu", 1, 16<<20)) })
	b.Run("accumulate/k8x1M", func(b *testing.B) { report(b, m.rows(b, "accumulate", 8, 1<<20)) })
	b.Run("rope/512x32x128", func(b *testing.B) { report(b, m.rows(b, "rope", 512, 32*128)) })
	b.Run("embed_f16/4096x4096", func(b *testing.B) { report(b, m.rows(b, "embed", 4096, 4096)) })
	// At 4096 positions and at a decode step's short context.
	b.Run("attention/32h8kv128d/4096", func(b *testing.B) { report(b, m.attention(b, 32, 8, 128, 4096)) })
	b.Run("attention/32h8kv128d/300", func(b *testing.B) { report(b, m.attention(b, 32, 8, 128, 300)) })
	b.Run("route_deepseek/1024x256", func(b *testing.B) { report(b, m.rows(b, "route", 1024, 256)) })
	b.Run("argmax/152064", func(b *testing.B) { report(b, m.rows(b, "argmax", 1, 152064)) })
	b.Run("topp/152064", func(b *testing.B) { report(b, m.rows(b, "topp", 1, 152064)) })
}

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

// newMeter prepares the shared device's kernels and warms the GPU up:
// GPUs idle at a low clock and take a while under load to raise it, so
// copies run for a while before anything is measured.
func newMeter(b *testing.B) *meter {
	d, k := shared.d, shared.k
	if err := k.Prepare(context.Background()); err != nil {
		b.Fatal(err)
	}
	m := &meter{d: d, k: k, cpu: d.Info().Type == "cpu"}
	m.warm(b, 500*time.Millisecond)
	return m
}

type meter struct {
	d   *gpu.Device
	k   *Kernels
	cpu bool // a CPU adapter (lavapipe): fewer repeats, smaller rotation
}

type copyResult struct{ engine, shader float64 }

func (c copyResult) best() float64 { return max(c.engine, c.shader) }

type result struct {
	bw     float64 // bytes per second, independent dispatches
	serial float64 // bytes per second, dependent dispatches (0 = not measured)
	per    time.Duration
}

func (m *meter) alloc(b *testing.B, n uint64) *gpu.Buffer {
	buf, err := m.d.Alloc(n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(buf.Release)
	return buf
}

// fill uploads pseudo-random bytes (a fixed pattern, cheap to make) so that
// no kernel runs on zeros.
func (m *meter) fill(b *testing.B, buf *gpu.Buffer, n uint64) {
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
func (m *meter) timeDispatches(b *testing.B, record func(bt *gpu.Batch, i int) error) time.Duration {
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
	n = min(n, m.d.Limits().MaxStorageBufferBindingSize/16*16)
	src, dst := m.alloc(b, n), m.alloc(b, n)
	m.fill(b, src, n)
	eng := m.timeDispatches(b, func(bt *gpu.Batch, i int) error { return bt.Copy(dst, src) })
	sh := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return m.k.CopyKernel(context.Background(), bt, src, dst, int(n))
	})
	bytes := float64(2 * n)
	return copyResult{engine: bytes / eng.Seconds(), shader: bytes / sh.Seconds()}
}

// rotation returns how many copies of a size-byte operand to rotate over so
// that they overflow the L2 (256 MiB in all; 4 on a CPU adapter).
func (m *meter) rotation(size uint64) int {
	if m.cpu {
		return 2
	}
	return int(min(max(ceilDiv(256<<20, size), 2), 64))
}

// q4kWeights returns copies of a rows x cols Q4_K matrix, enough of
// them to rotate over beyond the L2 (rotation).
func (m *meter) q4kWeights(b *testing.B, rows, cols int) []*gpu.Buffer {
	wBytes := abi.Q4K.Bytes(rows * cols)
	ws := make([]*gpu.Buffer, m.rotation(wBytes))
	blocks := benchQ4K(rows * cols / 256)
	for i := range ws {
		ws[i] = m.alloc(b, wBytes)
		if err := m.d.Upload(context.Background(), ws[i], blocks); err != nil {
			b.Fatal(err)
		}
	}
	return ws
}

func (m *meter) q4kMatVec(b *testing.B, rows, cols, n int, cfg Q4KConfig) result {
	ctx := context.Background()
	wBytes := abi.Q4K.Bytes(rows * cols)
	ws := m.q4kWeights(b, rows, cols)
	nw := len(ws)
	x := m.alloc(b, uint64(n*cols*4))
	m.fill(b, x, uint64(n*cols*4))
	bytes := float64(wBytes) + float64(n*cols*4) + float64(n*rows*4)
	return m.independentAndSerial(b, bytes, uint64(n*rows*4), func(bt *gpu.Batch, i int, y *gpu.Buffer) error {
		return m.k.Q4KMatMulWith(ctx, bt, cfg, ws[i%nw], x, y, MatShape{Rows: rows, Cols: cols, Tokens: n})
	})
}

// independentAndSerial times record twice: with a distinct output buffer
// (of ySize bytes) per call, so that calls may overlap, and with one shared
// output, so that each waits for the previous one. bytes is what one call
// must move.
func (m *meter) independentAndSerial(b *testing.B, bytes float64, ySize uint64, record func(bt *gpu.Batch, i int, y *gpu.Buffer) error) result {
	ys := m.outputs(b, ySize)
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error { return record(bt, i, ys[i%len(ys)]) })
	serial := m.timeDispatches(b, func(bt *gpu.Batch, i int) error { return record(bt, i, ys[0]) })
	return result{bw: bytes / per.Seconds(), serial: bytes / serial.Seconds(), per: per}
}

// q4kGroup times Q4KMatVecGroup: e products of rows x cols in one dispatch,
// weights from two arenas of 15 slots (< 128 MiB each, the smallest storage
// binding limit we run on) used alternately, so that a dispatch never
// reads slots the previous one left in the L2.
func (m *meter) q4kGroup(b *testing.B, rows, cols, e int, sharedX bool, cfg Q4KConfig) result {
	ctx := context.Background()
	wBytes := abi.Q4K.Bytes(rows * cols)
	nslots := min(15, int((128<<20)/wBytes))
	if nslots < e {
		b.Skipf("%d products of %d bytes do not fit a 128 MiB arena", e, wBytes)
	}
	blocks := benchQ4K(rows * cols / 256)
	var arenas [2]*gpu.Buffer
	for i := range arenas {
		arenas[i] = m.alloc(b, uint64(nslots)*wBytes)
		for s := range nslots {
			if err := m.d.Upload(ctx, arenas[i].Sub(uint64(s)*wBytes, wBytes), blocks); err != nil {
				b.Fatal(err)
			}
		}
	}
	nx := e
	if sharedX {
		nx = 1
	}
	x := m.alloc(b, uint64(nx*cols*4))
	m.fill(b, x, uint64(nx*cols*4))
	slots := func(i int) []int {
		out := make([]int, e)
		for j := range out {
			out[j] = (i*e + j) % nslots
		}
		return out
	}
	bytes := float64(e) * (float64(wBytes) + float64(rows*4))
	bytes += float64(nx * cols * 4)
	return m.independentAndSerial(b, bytes, uint64(e*rows*4), func(bt *gpu.Batch, i int, y *gpu.Buffer) error {
		return m.k.Q4KMatVecGroupWith(ctx, bt, cfg, Group{Arena: arenas[i%2], Slots: slots(i), X: x, SharedX: sharedX, Y: y, Rows: rows, Cols: cols})
	})
}

// q4kProbe times testdata/q4k_probe.wgsl in one MODE: the Q4_K kernels'
// memory accesses without their arithmetic, the ceiling an access pattern
// allows.
func (m *meter) q4kProbe(b *testing.B, rows, cols, mode int, cfg Q4KConfig) result {
	ctx := context.Background()
	src, err := os.ReadFile("testdata/q4k_probe.wgsl")
	if err != nil {
		b.Skip(err)
	}
	p, err := m.d.Compile(ctx, gpu.Kernel{Name: "q4k_probe", Source: string(src),
		Constants: map[string]float64{"ROWS": float64(cfg.Rows), "MODE": float64(mode)},
		Bindings:  []gpu.Access{gpu.ReadOnly, gpu.ReadOnly, gpu.ReadOnly, gpu.ReadWrite}, Params: 20})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Release()
	wBytes := abi.Q4K.Bytes(rows * cols)
	ws := m.q4kWeights(b, rows, cols)
	nw := len(ws)
	x := m.alloc(b, uint64(cols*4))
	m.fill(b, x, uint64(cols*4))
	ys := m.outputs(b, uint64(rows*4))
	rowsPerWG := uint64(cfg.Rows * 32 / cfg.SPR)
	gx, gy := grid(ceilDiv(uint64(rows), rowsPerWG))
	params := gpu.Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(1).U32(gx)
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return bt.Dispatch(p, [3]uint32{gx, gy, 1}, params, ws[i%nw], ws[i%nw], x, ys[i%len(ys)])
	})
	bytes := float64(wBytes) + float64(cols*4) + float64(rows*4)
	return result{bw: bytes / per.Seconds(), per: per}
}

// q4kMathOnly times q4k_matmul with its weight and x indices folded onto a
// few blocks (always cached): the arithmetic without the memory traffic.
func (m *meter) q4kMathOnly(b *testing.B, rows, cols int, cfg Q4KConfig) result {
	ctx := context.Background()
	spec, _ := Builtin("q4k_matmul", map[string]float64{"ROWS": float64(cfg.Rows), "TOK": 1, "CONV": 1, "PIPE": 0})
	src := spec.Source
	for _, r := range [][2]string{
		{"let blk = wbase + (min(row0 + r, p.rows - 1u) * p.nb + b) * 9u;", "let blk = ((row0 + r) & 3u) * 9u;"},
		{"xs = load_x(xb);", "xs = load_x(xb & 63u);"},
	} {
		if !strings.Contains(src, r[0]) {
			b.Fatalf("math-only probe: kernel source no longer has %q; update the replacements", r[0])
		}
		src = strings.ReplaceAll(src, r[0], r[1])
	}
	spec.Name, spec.Source = "q4k_mathonly", src
	p, err := m.d.Compile(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Release()
	wBytes := abi.Q4K.Bytes(rows * cols)
	w := m.alloc(b, wBytes)
	if err := m.d.Upload(ctx, w, benchQ4K(rows*cols/256)); err != nil {
		b.Fatal(err)
	}
	x := m.alloc(b, uint64(cols*4))
	m.fill(b, x, uint64(cols*4))
	ys := m.outputs(b, uint64(rows*4))
	rowsPerWG := uint64(cfg.Rows * 32 / cfg.SPR)
	gx, gy := grid(ceilDiv(uint64(rows), rowsPerWG))
	params := gpu.Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(1).U32(gx)
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return bt.Dispatch(p, [3]uint32{gx, gy, 1}, params, w, x, ys[i%len(ys)])
	})
	// gpu.Bytes the real kernel would move, for comparison.
	bytes := float64(wBytes) + float64(cols*4) + float64(rows*4)
	return result{bw: bytes / per.Seconds(), per: per}
}

// outputs returns maxReps output buffers: every dispatch of a batch writes
// its own, since wgpu puts a pipeline barrier (which drains the GPU) before
// a dispatch that writes a buffer an earlier dispatch of the batch wrote.
func (m *meter) outputs(b *testing.B, n uint64) []*gpu.Buffer {
	ys := make([]*gpu.Buffer, maxReps)
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

func (m *meter) dequant(b *testing.B, n int, out abi.DType) result {
	ctx := context.Background()
	wBytes := abi.Q4K.Bytes(n)
	w := m.alloc(b, wBytes)
	if err := m.d.Upload(ctx, w, benchQ4K(n/256)); err != nil {
		b.Fatal(err)
	}
	ys := []*gpu.Buffer{m.alloc(b, out.Bytes(n)), m.alloc(b, out.Bytes(n))}
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return m.k.Q4KDequant(ctx, bt, out, w, ys[i%2], n)
	})
	return result{bw: float64(wBytes+out.Bytes(n)) / per.Seconds(), per: per}
}

func (m *meter) dense(b *testing.B, dt abi.DType, rows, cols, n int) result {
	ctx := context.Background()
	wBytes := dt.Bytes(rows * cols)
	nw := m.rotation(wBytes)
	ws := make([]*gpu.Buffer, nw)
	for i := range ws {
		ws[i] = m.alloc(b, wBytes)
		m.fill(b, ws[i], wBytes)
	}
	x := m.alloc(b, uint64(n*cols*4))
	m.fill(b, x, uint64(n*cols*4))
	ys := make([]*gpu.Buffer, 16)
	for i := range ys {
		ys[i] = m.alloc(b, uint64(n*rows*4))
	}
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return m.k.MatMul(ctx, bt, dt, ws[i%nw], x, ys[i%len(ys)], MatShape{Rows: rows, Cols: cols, Tokens: n})
	})
	bytes := float64(wBytes) + float64(n*cols*4+n*rows*4)
	return result{bw: bytes / per.Seconds(), per: per}
}

// rows benchmarks the elementwise and per-row kernels over n x dim inputs.
func (m *meter) rows(b *testing.B, kernel string, n, dim int) result {
	ctx := context.Background()
	f32 := uint64(n * dim * 4)
	in := [2]*gpu.Buffer{m.alloc(b, f32), m.alloc(b, f32)}
	out := [2]*gpu.Buffer{m.alloc(b, f32), m.alloc(b, f32)}
	for _, x := range append(in[:], out[:]...) {
		m.fill(b, x, f32)
	}
	small := m.alloc(b, uint64(max(dim, n*8)*4))
	m.fill(b, small, uint64(max(dim, n*8)*4))
	var bytes float64
	var rec func(bt *gpu.Batch, i int) error
	switch kernel {
	case "rmsnorm":
		bytes = float64(2*f32) + float64(dim*4)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.RMSNorm(ctx, bt, in[i%2], small, out[i%2], NormShape{Rows: n, Dim: dim, Eps: 1e-5})
		}
	case "softmax":
		bytes = float64(2 * f32)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.Softmax(ctx, bt, in[i%2], out[i%2], RowsShape{Rows: n, Dim: dim})
		}
	case "swiglu":
		bytes = float64(3 * f32)
		rec = func(bt *gpu.Batch, i int) error { return m.k.SwiGLU(ctx, bt, in[0], in[1], out[i%2], n*dim) }
	case "accumulate":
		// n experts of dim: read n*dim + dim, write dim.
		bytes = float64(f32) + float64(2*dim*4)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.Accumulate(ctx, bt, in[i%2], small, out[i%2], AccumShape{Experts: n, Dim: dim})
		}
	case "rope":
		bytes = float64(2 * f32)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.Rope(ctx, bt, out[i%2], small, RopeShape{Tokens: n, Heads: dim / 128, HeadDim: 128, RotDim: 128, Pos0: 100})
		}
	case "embed":
		// f16 table of n rows; dim-wide outputs for n tokens.
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32((i * 7919) % n)
		}
		idb := m.alloc(b, uint64(n*4))
		if err := m.d.Upload(ctx, idb, gpu.Bytes(ids)); err != nil {
			b.Fatal(err)
		}
		bytes = float64(f32/2) + float64(f32) + float64(n*4)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.Embed(ctx, bt, in[i%2], idb, out[i%2], EmbedShape{Type: abi.F16, Tokens: n, Dim: dim, Vocab: n})
		}
	case "route":
		// n tokens of dim experts, DeepSeek-V3 style.
		bytes = float64(f32) + float64(n*8*8)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.Route(ctx, bt, in[i%2], small, out[0], out[1], RouteShape{Tokens: n, Experts: dim, K: 8,
				Mode: abi.RouteSigmoidTopK, Groups: 8, TopKGroup: 4, Scale: 2.5})
		}
	case "argmax":
		bytes = float64(f32)
		rec = func(bt *gpu.Batch, i int) error { return m.k.Argmax(ctx, bt, in[i%2], out[i%2], dim) }
	case "topp":
		bytes = float64(f32)
		rec = func(bt *gpu.Batch, i int) error {
			return m.k.TopP(ctx, bt, in[i%2], out[i%2], TopPShape{N: dim, Temperature: 0.8, TopP: 0.9, U: 0.37})
		}
	default:
		b.Fatalf("no benchmark for %s", kernel)
	}
	per := m.timeDispatches(b, rec)
	return result{bw: bytes / per.Seconds(), per: per}
}

func (m *meter) attention(b *testing.B, heads, kvHeads, hd, kvLen int) result {
	ctx := context.Background()
	kv := uint64(kvLen * kvHeads * hd * 4)
	q := m.alloc(b, uint64(heads*hd*4))
	m.fill(b, q, uint64(heads*hd*4))
	ks, vs := m.kvCaches(b, kv)
	outs := [2]*gpu.Buffer{m.alloc(b, uint64(heads*hd*4)), m.alloc(b, uint64(heads*hd*4))}
	s := AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, KVLen: kvLen, Scale: 0.088}
	record := func(bt *gpu.Batch, i int) error {
		return m.k.Attention(ctx, bt, q, ks[i%len(ks)], vs[i%len(vs)], outs[i%2], s)
	}
	return m.attnResult(b, record, kv, heads*hd)
}

// kvCaches allocates the rotation of filled K and V caches of kv bytes
// each that the attention benchmarks cycle through.
func (m *meter) kvCaches(b *testing.B, kv uint64) (ks, vs []*gpu.Buffer) {
	nr := m.rotation(2 * kv)
	ks, vs = make([]*gpu.Buffer, nr), make([]*gpu.Buffer, nr)
	for i := range ks {
		ks[i], vs[i] = m.alloc(b, kv), m.alloc(b, kv)
		m.fill(b, ks[i], kv)
		m.fill(b, vs[i], kv)
	}
	return ks, vs
}

// attnResult times an attention's record: its bytes are both caches (kv
// bytes each), q and the output (n floats each).
func (m *meter) attnResult(b *testing.B, record func(bt *gpu.Batch, i int) error, kv uint64, n int) result {
	per := m.timeDispatches(b, record)
	m.profileDispatches(b, record)
	return result{bw: float64(2*kv+uint64(2*n*4)) / per.Seconds(), per: per}
}

// ropeAttention times the decode step's attention flavor: RoPE of the
// new position's q and k, its k and v rows stored, the split and the
// merge writing quantized output (RopeAttention), at position kvLen - 1.
// The bytes are attention's: the caches read, q and the output.
func (m *meter) ropeAttention(b *testing.B, heads, kvHeads, hd, kvLen int) result {
	ctx := context.Background()
	kvn := kvHeads * hd
	kv := uint64(kvLen * kvn * 4)
	n := uint64((heads + 2*kvHeads) * hd * 4)
	qkv := m.alloc(b, n)
	m.fill(b, qkv, n)
	freqs := uploadF32(b, m.d, RopeFreqs(10000, hd))
	ks, vs := m.kvCaches(b, kv)
	out := [2]*gpu.Buffer{m.alloc(b, uint64(heads*hd*4)), m.alloc(b, uint64(heads*hd*4))}
	outq := [2]*gpu.Buffer{m.alloc(b, XQBytes(heads*hd)), m.alloc(b, XQBytes(heads*hd))}
	as := AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, KVLen: kvLen, Scale: 0.088}
	rs := RopeShape{Tokens: 1, Heads: heads + kvHeads, HeadDim: hd, RotDim: hd, Pos0: kvLen - 1, Style: abi.RopeNeoX}
	kvs := KVShape{Dim: kvn, KOff: heads * hd, VOff: (heads + kvHeads) * hd, Pos: kvLen - 1}
	if _, _, _, ok, err := RopeAttentionLaunches(as, rs, kvs); err != nil || !ok {
		b.Fatalf("RopeAttentionLaunches: fused %v, %v", ok, err)
	}
	record := func(bt *gpu.Batch, i int) error {
		return m.k.RopeAttention(ctx, bt, qkv, freqs, ks[i%len(ks)], vs[i%len(vs)], out[i%2], outq[i%2], as, rs, kvs)
	}
	return m.attnResult(b, record, kv, heads*hd)
}

// profileDispatches, with RDRR_BENCH_PROFILE=1, times 64 batches of one
// record each on the GPU (timestamps: every dispatch in a pass of its own)
// and reports each kernel's mean time as "<kernel>-us", so that an op of
// several dispatches says where its time goes.
func (m *meter) profileDispatches(b *testing.B, record func(bt *gpu.Batch, i int) error) {
	if os.Getenv("RDRR_BENCH_PROFILE") != "1" {
		return
	}
	ctx := context.Background()
	if err := m.d.StartProfile(); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 64; i++ {
		bt := m.d.Batch()
		if err := record(bt, i); err != nil {
			b.Fatal(err)
		}
		if err := bt.Submit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	p, err := m.d.StopProfile(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range p.Kernels {
		b.ReportMetric(float64(k.Total.Nanoseconds())/float64(k.Count)/1e3, k.Kernel+"-us")
	}
}
