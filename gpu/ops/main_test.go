package ops

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ref"
)

// The op tests share one device and one Kernels (compiling every
// variant once); runtime tests that count resources open their own.
type fixture struct {
	d *gpu.Device
	k *Kernels
}

var shared fixture // set by TestMain, read-only afterwards

func TestMain(m *testing.M) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		dir, _ := os.MkdirTemp("", "rdrr-xdg-")
		os.Setenv("XDG_RUNTIME_DIR", dir)
	}
	d, err := gpu.Open(context.Background(), testOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu tests need an adapter (make deps installs lavapipe):", err)
		os.Exit(1)
	}
	if err := useVariants(d, os.Getenv("RDRR_OPS_VARIANT")); err != nil {
		fmt.Fprintln(os.Stderr, "RDRR_OPS_VARIANT:", err)
		os.Exit(1)
	}
	shared = fixture{d: d, k: NewKernels(d)}
	code := m.Run()
	shared.k.Close()
	d.Close()
	os.Exit(code)
}

// useVariants makes the device compile other WGSL for built-in kernels:
// spec is "NAME=FILE;NAME=FILE...", each FILE the whole WGSL (includes
// expanded) with NAME's bindings. A way to test and time a kernel
// variant on a GPU with the test binary built once
// (scripts/vkstats/README.md).
func useVariants(d *gpu.Device, spec string) error {
	for _, v := range strings.Split(spec, ";") {
		if v == "" {
			continue
		}
		name, file, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("%q: want NAME=FILE", v)
		}
		of, err := Builtin(name, nil)
		if err != nil {
			return err
		}
		src, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		if err := d.UseVariant(context.Background(), gpu.Variant{Of: of, Name: name + "@" + file, Source: string(src)}); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "RDRR_OPS_VARIANT: %s is %s\n", name, file)
	}
	return nil
}

// testOptions honours RDRR_GPU_BACKEND (vulkan, gl, ...).
func testOptions() gpu.Options {
	var o gpu.Options
	// RDRR_BENCH_PROFILE=1: timestamps, so that benchmarks can say what
	// each kernel of an op took (profileDispatches).
	o.Profile = os.Getenv("RDRR_BENCH_PROFILE") == "1"
	if s := os.Getenv("RDRR_GPU_BACKEND"); s != "" {
		b, err := gpu.ParseBackend(s)
		if err == nil {
			o.Backend = b
		}
	}
	return o
}

// rng returns a generator seeded from RDRR_SEED or the clock, and logs the
// seed so a failure can be replayed.
func rng(t testing.TB) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RDRR_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	h := fnv.New64a()
	h.Write([]byte(t.Name()))
	t.Logf("seed %d (RDRR_SEED=%d replays it)", seed, seed)
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

func randF32(r *rand.Rand, n int, scale float64) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * scale)
	}
	return out
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// upload allocates a buffer holding data.
func upload(t testing.TB, d *gpu.Device, data []byte) *gpu.Buffer {
	t.Helper()
	b, err := d.Alloc(uint64(max(len(data), 4)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Release)
	if len(data) > 0 {
		if err := d.Upload(ctxT(t), b, data); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func uploadF32(t testing.TB, d *gpu.Device, xs []float32) *gpu.Buffer {
	return upload(t, d, gpu.Bytes(xs))
}

// poisoned allocates n bytes filled with 0xff (a NaN as f32, an absurd
// u32), so an element the kernel forgot to write fails the comparison.
func poisoned(t testing.TB, d *gpu.Device, n int) *gpu.Buffer {
	t.Helper()
	p := make([]byte, n)
	for i := range p {
		p[i] = 0xff
	}
	return upload(t, d, p)
}

func readF32(t testing.TB, d *gpu.Device, b gpu.Region, n int) []float32 {
	t.Helper()
	out := make([]float32, n)
	if err := d.Read(ctxT(t), b, gpu.Bytes(out)); err != nil {
		t.Fatal(err)
	}
	return out
}

func readU32(t testing.TB, d *gpu.Device, b gpu.Region, n int) []uint32 {
	t.Helper()
	out := make([]uint32, n)
	if err := d.Read(ctxT(t), b, gpu.Bytes(out)); err != nil {
		t.Fatal(err)
	}
	return out
}

// run records with f into a fresh batch and submits it.
func run(t testing.TB, d *gpu.Device, f func(b *gpu.Batch) error) {
	t.Helper()
	b := d.Batch()
	if err := f(b); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

func nanCount(xs []float32) int {
	n := 0
	for _, x := range xs {
		if math.IsNaN(float64(x)) {
			n++
		}
	}
	return n
}

// q4kArena uploads nslots random rows x cols Q4_K matrices as one arena
// (equal slots) and returns it, its bytes, and a function giving slot's
// weights.
func q4kArena(t *testing.T, d *gpu.Device, r *rand.Rand, nslots, rows, cols int) (*gpu.Buffer, []byte, func(slot int) []float64) {
	t.Helper()
	per := rows * cols / 256
	arena := randQ4K(r, nslots*per)
	return upload(t, d, arena), arena, func(slot int) []float64 {
		w, err := ref.Q4K(arena[slot*per*144 : (slot+1)*per*144])
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
}

// gluRef is silu(g) * u of two products (g, u and their magnitudes gm,
// um from ref.MatMul), with the products' error carried through.
func gluRef(g, gm, u, um []float64) (want, mag []float64) {
	for i := range g {
		s := 1 / (1 + math.Exp(-g[i]))
		want = append(want, g[i]*s*u[i])
		mag = append(mag, math.Abs(s*(1+g[i]*(1-s))*u[i])*gm[i]+math.Abs(g[i]*s)*um[i])
	}
	return want, mag
}
