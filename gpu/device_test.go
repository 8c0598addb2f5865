package gpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func openDevice(t testing.TB, o Options) *Device {
	t.Helper()
	base := testOptions()
	o.Backend = base.Backend
	d, err := Open(ctxT(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func TestInfoAndAdapters(t *testing.T) {
	ads, err := ListAdapters(ctxT(t), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	info := shared.d.Info()
	t.Logf("device: %v", info)
	if info.Backend == BackendAuto || info.Type == "" || info.Limits.MaxBufferSize == 0 || len(info.Features) == 0 {
		t.Fatalf("incomplete info: %+v", info)
	}
	if ads[0].Backend != info.Backend || ads[0].Driver != info.Driver {
		t.Errorf("Open picked %v; ListAdapters ranks %v first", info, ads[0])
	}
	if _, err := ListAdapters(ctxT(t), Options{Adapter: "no-such-adapter-xyz"}); !errors.Is(err, ErrNoAdapter) {
		t.Errorf("unknown adapter: err = %v; want ErrNoAdapter", err)
	}
	for _, s := range []string{"auto", "vulkan", "metal", "dx12", "gl"} {
		b, err := ParseBackend(s)
		if err != nil || b.String() != s {
			t.Errorf("ParseBackend(%q) = %v, %v", s, b, err)
		}
	}
	if _, err := ParseBackend("cuda"); err == nil {
		t.Error("ParseBackend accepted cuda")
	}
}

func TestLimits(t *testing.T) {
	ads, err := ListAdapters(ctxT(t), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if max := ads[0].Limits.MaxBufferSize; max < math.MaxUint64 {
		o := testOptions()
		o.MaxBufferSize = max + 1
		if _, err := Open(ctxT(t), o); !errors.Is(err, ErrLimit) {
			t.Fatalf("asking more than the adapter offers: err = %v; want ErrLimit", err)
		}
	}
	d := openDevice(t, Options{MaxBufferSize: 1 << 20})
	if _, err := d.Alloc(2 << 20); !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "max buffer size") {
		t.Fatalf("buffer over the limit: err = %v; want ErrLimit naming the limit", err)
	}
}

func TestUploadRead(t *testing.T) {
	// Small staging buffers so that uploads cross many of them.
	d := openDevice(t, Options{StagingBuffers: 3, StagingSize: 64 << 10, CopyWorkers: 4})
	r := rng(t)
	for _, n := range []int{1, 3, 4, 1000, 64 << 10, 64<<10 + 1, 3<<20 + 7} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			b := upload(t, d, src)
			got := make([]byte, n)
			if err := d.Read(ctxT(t), b, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, src) {
				t.Fatal("read back differs from upload")
			}
			// Write (queue.WriteBuffer) and a span in the middle.
			if n >= 8 {
				if err := d.Write(b.Sub(4, uint64(n-4)), src[:n-4]); err != nil {
					t.Fatal(err)
				}
				mid := make([]byte, n-4)
				if err := d.Read(ctxT(t), b.Sub(4, uint64(n-4)), mid); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(mid, src[:n-4]) {
					t.Fatal("span read differs")
				}
			}
		})
	}
	b, _ := d.Alloc(16)
	defer b.Release()
	if err := d.Upload(ctxT(t), b, make([]byte, 17)); !errors.Is(err, ErrShape) {
		t.Errorf("oversized upload: err = %v; want ErrShape", err)
	}
	if err := d.Upload(ctxT(t), b.Sub(2, 8), make([]byte, 8)); !errors.Is(err, ErrShape) {
		t.Errorf("unaligned upload: err = %v; want ErrShape", err)
	}
}

// TestConcurrent uploads, computes and reads from several goroutines at
// once (run it with -race).
func TestConcurrent(t *testing.T) {
	d := openDevice(t, Options{StagingBuffers: 2, StagingSize: 256 << 10})
	k := NewKernels(d)
	defer k.Close()
	const workers, rounds = 4, 8
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 100000 + 1000*w
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(i%97) - float32(w)
			}
			for it := 0; it < rounds; it++ {
				xb, err := d.Alloc(uint64(4 * n))
				if err != nil {
					errc <- err
					return
				}
				yb, _ := d.Alloc(uint64(4 * n))
				ones, _ := d.Alloc(uint64(4 * n))
				one := make([]float32, n)
				for i := range one {
					one[i] = 1
				}
				ctx := context.Background()
				if err := d.Upload(ctx, xb, Bytes(x)); err != nil {
					errc <- err
					return
				}
				if err := d.Upload(ctx, ones, Bytes(one)); err != nil {
					errc <- err
					return
				}
				b := d.Batch()
				if err := k.SwiGLU(ctx, b, ones, xb, yb, n); err != nil {
					errc <- err
					return
				}
				if err := b.Submit(ctx); err != nil {
					errc <- err
					return
				}
				got := make([]float32, n)
				if err := d.Read(ctx, yb, Bytes(got)); err != nil {
					errc <- err
					return
				}
				// silu(1) * x
				const silu1 = 0.7310585786300049
				for i := 0; i < n; i += 997 {
					if want := silu1 * float64(x[i]); abs(float64(got[i])-want) > 1e-5*(1+abs(want)) {
						errc <- fmt.Errorf("worker %d: y[%d] = %v; want %v", w, i, got[i], want)
						return
					}
				}
				xb.Release()
				yb.Release()
				ones.Release()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func TestPoolReuse(t *testing.T) {
	d := openDevice(t, Options{})
	a, _ := d.Alloc(1000)
	a.Release()
	a.Release() // idempotent
	before := d.Stats()
	b, _ := d.Alloc(900) // same size class
	after := d.Stats()
	if after.Reuses != before.Reuses+1 || after.Allocs != before.Allocs {
		t.Fatalf("Alloc after Release did not reuse: before %+v after %+v", before, after)
	}
	b.Release()
	for _, c := range []struct{ n, class uint64 }{{1, 256}, {256, 256}, {257, 320}, {1000, 1024}, {64 << 20, 64 << 20}, {(64 << 20) + 1, 80 << 20}} {
		if got := sizeClass(c.n); got != c.class {
			t.Errorf("sizeClass(%d) = %d; want %d", c.n, got, c.class)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	d := shared.d
	_, err := d.Compile(ctxT(t), Kernel{Name: "broken", Source: "fn main( {", Bindings: []Access{ReadOnly}})
	var ke *KernelError
	if !errors.Is(err, ErrCompile) || !errors.As(err, &ke) || ke.Kernel != "broken" || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("bad WGSL: err = %v; want a KernelError naming %q wrapping ErrCompile", err, "broken")
	}
	// Entry point missing: the pipeline step fails.
	spec, _ := Builtin("swiglu", nil)
	spec.Name, spec.Entry = "no-entry", "nope"
	if _, err := d.Compile(ctxT(t), spec); !errors.Is(err, ErrCompile) || !strings.Contains(err.Error(), "no-entry") {
		t.Fatalf("missing entry point: err = %v", err)
	}
	// Bindings that do not match the WGSL.
	spec, _ = Builtin("swiglu", nil)
	spec.Name, spec.Bindings = "wrong-abi", []Access{ReadOnly, ReadOnly}
	if _, err := d.Compile(ctxT(t), spec); !errors.Is(err, ErrCompile) {
		t.Fatalf("mismatched bindings: err = %v", err)
	}
	// Unknown constant.
	spec, _ = Builtin("q4k_matmul", map[string]float64{"NOPE": 1})
	if _, err := d.Compile(ctxT(t), spec); !errors.Is(err, ErrCompile) || !strings.Contains(err.Error(), "NOPE") {
		t.Fatalf("unknown constant: err = %v", err)
	}
	// Bad constant value.
	spec, _ = Builtin("q4k_matmul", map[string]float64{"ROWS": 1.5})
	if _, err := d.Compile(ctxT(t), spec); !errors.Is(err, ErrCompile) {
		t.Fatalf("fractional u32 constant: err = %v", err)
	}
	// The device still works.
	if err := d.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestApplyConstants(t *testing.T) {
	src := "override A: u32 = 4u;\noverride B = 2;\noverride C: f32 = 1.5;\noverride D: bool = true;\n"
	got, err := applyConstants(src, map[string]float64{"A": 8, "C": 0.25, "D": 0})
	if err != nil {
		t.Fatal(err)
	}
	want := "const A: u32 = 8u;\nconst B = 2;\nconst C: f32 = f32(0.25);\nconst D: bool = false;\n"
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := applyConstants("override X: u32;", nil); err == nil {
		t.Fatal("override without default or value accepted")
	}
	if got, err := (Kernel{Source: src, Constants: map[string]float64{"A": 8, "C": 0.25, "D": 0}}).Specialized(); err != nil || got != want {
		t.Fatalf("Specialized: got\n%s\n(%v); want\n%s", got, err, want)
	}
}

func TestPipelineCache(t *testing.T) {
	d := openDevice(t, Options{})
	spec, _ := Builtin("swiglu", nil)
	p1, err := d.Compile(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := d.Compile(ctxT(t), spec)
	if p1.e != p2.e || d.Stats().Compiles != 1 {
		t.Fatalf("identical kernels compiled twice: %+v", d.Stats())
	}
	p1.Release()
	p1.Release()
	b := d.Batch()
	x, _ := d.Alloc(1024)
	defer x.Release()
	y, _ := d.Alloc(1024)
	defer y.Release()
	if err := b.Dispatch(p1, [3]uint32{1, 1, 1}, nil, x, x, y); !errors.Is(err, ErrClosed) {
		t.Fatalf("dispatch of a released handle: err = %v; want ErrClosed", err)
	}
	b = d.Batch()
	if err := b.Dispatch(p2, [3]uint32{1, 1, 1}, Params{}.U32(256).U32(1), x, x, y); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	p2.Release()
}

func TestBatchValidation(t *testing.T) {
	d, k := shared.d, shared.k
	x, _ := d.Alloc(1024)
	defer x.Release()
	y, _ := d.Alloc(1024)
	b := d.Batch()
	if err := k.SwiGLU(ctxT(t), b, x, x, y, 1000); !errors.Is(err, ErrShape) || !strings.Contains(err.Error(), "swiglu") {
		t.Fatalf("too small a buffer: err = %v", err)
	}
	if err := b.Submit(ctxT(t)); !errors.Is(err, ErrShape) {
		t.Fatalf("Submit after a recording error: err = %v; want the recording error", err)
	}
	spec, _ := Builtin("swiglu", nil)
	p, err := d.Compile(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	b = d.Batch()
	if err := b.Dispatch(p, [3]uint32{70000, 1, 1}, nil, x, x, y); !errors.Is(err, ErrLimit) {
		t.Fatalf("too many workgroups: err = %v; want ErrLimit", err)
	}
	b = d.Batch()
	if err := b.Dispatch(p, [3]uint32{1, 1, 1}, nil, x, y); !errors.Is(err, ErrShape) {
		t.Fatalf("missing binding: err = %v", err)
	}
	// A buffer released between recording and submit: an error, not a
	// crash (wgpu-native aborts on an invalid submit).
	b = d.Batch()
	if err := k.SwiGLU(ctxT(t), b, x, x, y, 256); err != nil {
		t.Fatal(err)
	}
	y.Release()
	if err := b.Submit(ctxT(t)); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "swiglu") {
		t.Fatalf("released buffer: err = %v; want ErrClosed naming swiglu", err)
	}
	if err := b.Submit(ctxT(t)); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Submit: err = %v", err)
	}
}

// TestDeviceLost checks that loss is reported as an error naming the
// kernel, that nothing blocks or crashes, and that a new device works.
func TestDeviceLost(t *testing.T) {
	d := openDevice(t, Options{})
	k := NewKernels(d)
	defer k.Close()
	x, _ := d.Alloc(1024)
	y, _ := d.Alloc(1024)
	b := d.Batch()
	if err := k.SwiGLU(ctxT(t), b, x, x, y, 256); err != nil {
		t.Fatal(err)
	}
	d.markLost("simulated by the test")
	if err := b.Submit(ctxT(t)); !errors.Is(err, ErrDeviceLost) || !strings.Contains(err.Error(), "swiglu") {
		t.Fatalf("Submit after loss: err = %v; want ErrDeviceLost naming swiglu", err)
	}
	if err := d.Upload(ctxT(t), x, make([]byte, 16)); !errors.Is(err, ErrDeviceLost) {
		t.Fatalf("Upload after loss: err = %v", err)
	}
	if err := d.Read(ctxT(t), x, make([]byte, 16)); !errors.Is(err, ErrDeviceLost) {
		t.Fatalf("Read after loss: err = %v", err)
	}
	if err := d.Sync(ctxT(t)); !errors.Is(err, ErrDeviceLost) {
		t.Fatalf("Sync after loss: err = %v", err)
	}
	if err := d.Err(); !errors.Is(err, ErrDeviceLost) {
		t.Fatalf("Err = %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	// Recreate and compute.
	d2 := openDevice(t, Options{})
	k2 := NewKernels(d2)
	defer k2.Close()
	g := uploadF32(t, d2, []float32{0, 1, -1, 2})
	u := uploadF32(t, d2, []float32{1, 1, 1, 1})
	out := poisoned(t, d2, 16)
	run(t, d2, func(b *Batch) error { return k2.SwiGLU(ctxT(t), b, g, u, out, 4) })
	got := readF32(t, d2, out, 4)
	if got[0] != 0 || abs(float64(got[1])-0.7310586) > 1e-6 {
		t.Fatalf("new device computes %v", got)
	}
}

func TestClosed(t *testing.T) {
	d := openDevice(t, Options{})
	x, _ := d.Alloc(64)
	d.Close()
	d.Close()
	if _, err := d.Alloc(64); !errors.Is(err, ErrClosed) {
		t.Fatalf("Alloc after Close: err = %v", err)
	}
	if err := d.Upload(ctxT(t), x, make([]byte, 4)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Upload after Close: err = %v", err)
	}
	x.Release()
}

// TestNoLeaks runs 1,000 create/destroy cycles of buffers and of pipelines
// (each with a distinct constant, so each is a new native pipeline) and
// checks that the device's counters, wgpu-native's own registry and the
// goroutine count return to their baselines.
func TestNoLeaks(t *testing.T) {
	cycles := 1000
	if testing.Short() {
		cycles = 200
	}
	g0 := runtime.NumGoroutine()
	d, err := Open(ctxT(t), Options{Backend: testOptions().Backend, PoolBytes: -1, IdlePipelines: -1, StagingSize: 1 << 16, StagingBuffers: 2})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := Builtin("swiglu", nil)
	spec.Source += "\noverride LEAK_PROBE: u32 = 0u;\n"
	x, _ := d.Alloc(1024)
	y, _ := d.Alloc(1024)
	// Warm up everything that is created once (staging ring, layouts).
	if err := d.Upload(ctxT(t), x, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	warm, _ := d.Compile(ctxT(t), spec)
	warm.Release()
	d.Sync(ctxT(t))
	base := d.Stats()
	nb, np, ng, nm := d.nativeCounts()
	for i := 0; i < cycles; i++ {
		b, err := d.Alloc(uint64(256 + 64*(i%50)))
		if err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			if err := d.Upload(ctxT(t), b, make([]byte, 256)); err != nil {
				t.Fatal(err)
			}
		}
		s := spec
		s.Constants = map[string]float64{"LEAK_PROBE": float64(i + 1)}
		p, err := d.Compile(ctxT(t), s)
		if err != nil {
			t.Fatal(err)
		}
		bt := d.Batch()
		if err := bt.Dispatch(p, [3]uint32{1, 1, 1}, Params{}.U32(16).U32(1), x, b, y); err != nil {
			t.Fatal(err)
		}
		if err := bt.Submit(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		p.Release()
		b.Release()
		if i%100 == 99 {
			d.Sync(ctxT(t))
		}
	}
	if err := d.Sync(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	got := d.Stats()
	if got.NativeBuffers != base.NativeBuffers || got.LiveBuffers != base.LiveBuffers || got.Pipelines != base.Pipelines ||
		got.PooledBuffers != 0 || got.PendingOps != 0 {
		t.Errorf("after %d cycles: %+v; baseline %+v", cycles, got, base)
	}
	if got.Allocs < base.Allocs+uint64(cycles) || got.Compiles < base.Compiles+uint64(cycles) {
		t.Errorf("cycles did not create new resources: %+v", got)
	}
	// Bind groups name destroyed buffers: they must be gone too.
	if got.BindGroups > base.BindGroups+2 {
		t.Errorf("bind groups grew from %d to %d", base.BindGroups, got.BindGroups)
	}
	// wgpu-native frees lazily: poll until its registry settles.
	var nb2, np2, ng2, nm2 uint64
	for try := 0; try < 50; try++ {
		d.Sync(ctxT(t))
		nb2, np2, ng2, nm2 = d.nativeCounts()
		if nb2 <= nb && np2 <= np && ng2 <= ng+2 && nm2 <= nm {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if nb2 > nb || np2 > np || ng2 > ng+2 || nm2 > nm {
		t.Errorf("wgpu registry: buffers %d->%d, pipelines %d->%d, bind groups %d->%d, modules %d->%d",
			nb, nb2, np, np2, ng, ng2, nm, nm2)
	}
	x.Release()
	y.Release()
	d.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > g0 {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after Close; %d before Open\n%s", n, g0, buf[:runtime.Stack(buf, true)])
	}
}

// TestConcurrentOpen lists adapters and opens, uses and closes devices
// from two goroutines at once, on the backend the shared device runs on.
// When every instance included the GL backend, EGL aborted the process
// within a second of this (issue 16); an instance of the named backend
// alone leaves GL out.
func TestConcurrentOpen(t *testing.T) {
	b := shared.d.Info().Backend
	if b == BackendGL {
		t.Skip("wgpu's GL backend does not take several devices in one process")
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5 {
				if _, err := ListAdapters(ctxT(t), Options{Backend: b}); err != nil {
					errc <- err
					return
				}
				d, err := Open(ctxT(t), Options{Backend: b})
				if err != nil {
					errc <- err
					return
				}
				src := []byte(fmt.Sprintf("worker %d, device %d", w, i))
				x, err := d.Alloc(64)
				if err == nil {
					err = d.Upload(ctxT(t), x, src)
				}
				got := make([]byte, len(src))
				if err == nil {
					err = d.Read(ctxT(t), x, got)
				}
				if err == nil && !bytes.Equal(got, src) {
					err = fmt.Errorf("worker %d, device %d: read %q; wrote %q", w, i, got, src)
				}
				d.Close()
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// TestSubmissionOutlastsWgpuWait runs one submission that takes longer
// than the 5 s that wgpu-native v22 waits in a blocking poll before it
// treats a submission as finished regardless (gfx-rs/wgpu#3601). The old
// poller blocked there, and under load wgpu then recycled a command buffer
// that lavapipe was still running (issue 16's crash). This checks that a
// submission that long completes, reads back exactly (an exact reference,
// so an early read fails) and leaves the device usable. On an idle machine
// the old poller passed it too: there its blocking poll returned only when
// the submission finished (after 11.5 s, not 5 s); the early returns, and
// the crash, came under load.
func TestSubmissionOutlastsWgpuWait(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a kernel for about 8 s")
	}
	src, err := os.ReadFile("testdata/spin.wgsl")
	if err != nil {
		t.Fatal(err)
	}
	d := shared.d
	p, err := d.Compile(ctxT(t), Kernel{Name: "spin", Source: string(src), Bindings: []Access{ReadWrite}, Params: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	// The reference against a plain loop.
	x := uint32(7)
	for range 1000 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
	}
	if got := xorshiftPow(1000).apply(7); got != x {
		t.Fatalf("reference: %#x after 1000 steps; the loop says %#x", got, x)
	}
	for n, acc := uint64(1), uint32(0); n <= 1000; n++ {
		if acc ^= uint32(n); xorUpTo(n) != acc {
			t.Fatalf("xorUpTo(%d) = %d; want %d", n, xorUpTo(n), acc)
		}
	}
	const iters = 60000 // under llvmpipe's loop limit
	const dispatches = 5
	// A loaded machine may stretch the long run well past its ~8 s.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spin := func(groups uint64) (time.Duration, uint32) {
		gx := min(groups, 65535)
		gy := (groups + gx - 1) / gx
		out, err := d.Alloc(4)
		if err != nil {
			t.Fatal(err)
		}
		defer out.Release()
		start := time.Now()
		b := d.Batch()
		if err := b.Clear(out); err != nil {
			t.Fatal(err)
		}
		// Several dispatches, so that commands remain to be read after
		// wgpu's wait gives up.
		for range dispatches {
			if err := b.Dispatch(p, [3]uint32{uint32(gx), uint32(gy), 1}, Params{}.U32(iters).U32(uint32(gx)), out); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Submit(ctx); err != nil {
			t.Fatal(err)
		}
		got := make([]uint32, 1)
		if err := d.Read(ctx, out, Bytes(got)); err != nil {
			t.Fatal(err)
		}
		// The n-step map applied to the XOR of the seeds 1..n (an even
		// number of dispatches would cancel out).
		seeds := xorUpTo(gx * gy * 64)
		if dispatches%2 == 0 {
			seeds = 0
		}
		if want := xorshiftPow(8 * iters).apply(seeds); got[0] != want {
			t.Errorf("%d workgroups: got %#x; want %#x (read before the kernel finished?)", gx*gy, got[0], want)
		}
		return time.Since(start), got[0]
	}
	spin(1) // compile
	// Calibrate with short runs, then size the long one to about 8 s.
	groups := uint64(16)
	for {
		el, _ := spin(groups)
		if el >= 250*time.Millisecond || groups >= 1<<28 {
			groups = uint64(min(float64(groups)*8/el.Seconds(), 1<<30))
			break
		}
		groups *= 4
	}
	el, _ := spin(groups)
	t.Logf("one submission of %d dispatches of %d workgroups took %v", dispatches, groups, el.Round(time.Millisecond))
	if el < 6*time.Second {
		t.Logf("it finished within wgpu's 5 s wait (plus margin): this run did not exercise the timeout")
	}
	if err := d.Err(); err != nil {
		t.Fatal(err)
	}
}

// xorUpTo returns the low 32 bits of 1 ^ 2 ^ ... ^ n, which are the XOR of
// those numbers' low 32 bits (the kernel's u32 indices wrap the same way).
func xorUpTo(n uint64) uint32 {
	switch n % 4 {
	case 0:
		return uint32(n)
	case 1:
		return 1
	case 2:
		return uint32(n + 1)
	}
	return 0
}

// gf2 is a linear map on 32-bit words over GF(2): column j is the image
// of bit j.
type gf2 [32]uint32

func (m *gf2) apply(x uint32) uint32 {
	var y uint32
	for j := 0; x != 0; j, x = j+1, x>>1 {
		if x&1 != 0 {
			y ^= m[j]
		}
	}
	return y
}

// then returns the map "m, then n".
func (m *gf2) then(n *gf2) *gf2 {
	var r gf2
	for j := range r {
		r[j] = n.apply(m[j])
	}
	return &r
}

// xorshiftPow returns the map of n steps of xorshift32 (13, 17, 5).
func xorshiftPow(n uint64) *gf2 {
	var step, acc gf2
	for j := range step {
		x := uint32(1) << j
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		step[j] = x
		acc[j] = 1 << j
	}
	r, s := &acc, &step
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			r = r.then(s)
		}
		s = s.then(s)
	}
	return r
}

// A batch that needs more distinct bind groups than the cache holds: the
// cache clears while the pass is open, and the groups the pass has set
// must survive until it ends (wgpu aborted the process before).
func TestBindGroupCacheFullDuringEncode(t *testing.T) {
	d, k := smallBindGroupCache(t)
	ctx := ctxT(t)
	const n, dim = 12, 64
	src, _ := d.Alloc(n * dim * 4)
	dst, _ := d.Alloc(n * dim * 4)
	w, _ := d.Alloc(16)
	defer src.Release()
	defer dst.Release()
	defer w.Release()
	vals := make([]float32, n*dim)
	for i := range vals {
		vals[i] = float32(i % 7)
	}
	d.Write(src, Bytes(vals))
	d.Write(w, Bytes([]float32{2, 0, 0, 0}))
	d.Write(dst, make([]byte, n*dim*4))
	b := d.Batch()
	for i := 0; i < n; i++ { // each a different range: a new bind group
		sub := func(buf *Buffer) Span { return buf.Sub(uint64(i*dim*4), dim*4) }
		k.Accumulate(ctx, b, sub(src), w, sub(dst), 1, dim, 0)
	}
	if err := b.Submit(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n*dim*4)
	if err := d.Read(ctx, dst, got); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n*dim; i++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:])); v != 2*vals[i] {
			t.Fatalf("element %d = %g; want %g", i, v, 2*vals[i])
		}
	}
}

// smallBindGroupCache opens a device whose bind group cache holds 4
// groups, and its op kernels, closed when the test ends: a batch whose
// dispatches each bind other ranges clears the cache while it encodes.
func smallBindGroupCache(t *testing.T) (*Device, OpKernels) {
	t.Helper()
	o := testOptions()
	o.BindGroups = 4
	d, err := Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	k := NewKernels(d)
	t.Cleanup(func() {
		k.Close()
		d.Close()
	})
	return d, k
}

// With SpinWait a wait looks for its completion without blocking first:
// reads come back whole whether they end within the spin (50 ms) or after
// it (1 us), from several goroutines at once, a wait whose context is
// already done gives up without touching the read-back buffer, and no
// spinner is left counted (the poller would keep polling every few
// microseconds).
func TestSpinWait(t *testing.T) {
	for _, spin := range []time.Duration{time.Microsecond, 50 * time.Millisecond} {
		t.Run(spin.String(), func(t *testing.T) {
			d := openDevice(t, Options{SpinWait: spin})
			if d.spinWait != spin {
				t.Fatalf("spinWait %v; want %v", d.spinWait, spin)
			}
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					src := make([]byte, 1<<20+4*g)
					for i := range src {
						src[i] = byte(i*7 + g + i>>9)
					}
					b := upload(t, d, src)
					defer b.Release()
					for range 3 {
						got := make([]byte, len(src))
						if err := d.Read(ctxT(t), b, got); err != nil {
							t.Error(err)
							return
						}
						if !bytes.Equal(got, src) {
							t.Error("read back differs from upload")
							return
						}
					}
				}()
			}
			wg.Wait()
			b := upload(t, d, make([]byte, 4096))
			defer b.Release()
			pending, err := d.StartRead(b, 4096)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			cancel()
			if err := pending.Wait(ctx, make([]byte, 4096)); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("wait with a done context: %v", err)
			}
			if err := d.Sync(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if n := d.spinning.Load(); n != 0 {
				t.Fatalf("%d spinners left counted", n)
			}
		})
	}
}

// LocalMemory is what the Vulkan loader says of the adapter's largest
// device-local heap: present for a Vulkan adapter, and for a CPU one
// (lavapipe) no more than the machine's memory.
func TestLocalMemory(t *testing.T) {
	d := shared.d
	info := d.Info()
	n, free := d.LocalMemory()
	t.Logf("%s: largest device-local heap %d MiB, %d MiB of it free to this process (0: not said)", info, n>>20, free>>20)
	if info.Backend != BackendVulkan {
		if n != 0 || free != 0 {
			t.Fatalf("LocalMemory %d, %d on the %s backend; want 0 (only Vulkan's loader is asked)", n, free, info.Backend)
		}
		return
	}
	if free > n {
		t.Fatalf("LocalMemory: %d bytes free of a heap of %d", free, n)
	}
	if n < 64<<20 {
		t.Fatalf("LocalMemory %d bytes; a Vulkan adapter has a device-local heap of at least 64 MiB", n)
	}
	if info.Type == "cpu" {
		if total := memTotalForTest(t); total > 0 && n > total {
			t.Fatalf("LocalMemory %d bytes on a CPU adapter; the machine has %d", n, total)
		}
	}
}

// memTotalForTest is MemTotal from /proc/meminfo (0 where there is none).
func memTotalForTest(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("/proc/meminfo: %q: %v", line, err)
			}
			return kb << 10
		}
	}
	return 0
}
