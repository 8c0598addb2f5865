package experts

import (
	"context"
	"math"
	"os"
	"slices"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ref"
	"github.com/rdrr/peer/tiers"
)

// The GPU decode step matches the float64 reference on tiny-moe for 32
// steps, with a VRAM arena that holds a quarter of the experts (so
// experts are paged in and evicted), and greedy tokens are identical.
func TestGPUModelMatchesReference(t *testing.T) {
	t.Run("fused forms", func(t *testing.T) {
		// The o product adding into the residual and the down products
		// reading SwiGLU themselves (off by default; see noFuse).
		t.Setenv("RDRR_GPU_FUSE", "1")
		testGPUModelMatches(t, "tiny-moe", 0, true)
	})
	t.Run("one arena buffer", func(t *testing.T) { testGPUModelMatches(t, "tiny-moe", 0, false) })
	// 256 KiB buffers: 3 expert matrices per arena buffer, so a layer's
	// experts are spread over buffers and run one by one.
	t.Run("arena over several buffers", func(t *testing.T) { testGPUModelMatches(t, "tiny-moe", 256<<10, false) })
	// A dense first layer, a shared expert, sigmoid group-limited top-4.
	t.Run("deepseek-style", func(t *testing.T) { testGPUModelMatches(t, "tiny-deepseek", 0, false) })
	// Every expert resident (warmed into VRAM first): every MoE layer runs
	// masked, the router's choice staying on the GPU, one read-back a step.
	t.Run("resident", func(t *testing.T) { testGPUModelMatches(t, "tiny-moe", 0, true) })
	t.Run("resident, arena over several buffers", func(t *testing.T) { testGPUModelMatches(t, "tiny-moe", 256<<10, true) })
	t.Run("resident deepseek-style", func(t *testing.T) { testGPUModelMatches(t, "tiny-deepseek", 0, true) })
}

func testGPUModelMatches(t *testing.T, preset string, maxBuf uint64, resident bool) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	}
	var o gpu.Options
	if s := os.Getenv("RDRR_GPU_BACKEND"); s != "" {
		o.Backend, _ = gpu.ParseBackend(s)
	}
	o.MaxBufferSize, o.MaxStorageBinding = maxBuf, maxBuf
	d, err := gpu.Open(context.Background(), o)
	if err != nil {
		t.Fatalf("no GPU adapter (make deps installs lavapipe): %v", err)
	}
	defer d.Close()
	m, src := presetInStore(t, preset, 1)
	ctx := context.Background()
	slots := 3 * len(m.Experts) / 4
	if resident {
		slots = 3 * len(m.Experts)
	}
	arena, err := tiers.NewGPUArena(d, ExpertMatrixBytes(m), slots, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Release()
	gcache, err := tiers.New(tiers.Config{RAM: m.TotalSize, Arena: arena, Disk: src})
	if err != nil {
		t.Fatal(err)
	}
	defer gcache.Close()
	g, err := NewGPUModel(ctx, m, d, gcache, arena, 64)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	for l, w := range g.qkv {
		if w == nil {
			t.Fatalf("layer %d: q, k and v not stacked into one product", l)
		}
	}
	if resident {
		if err := gcache.Warm(ctx, g.ExpertKeys(), tiers.VRAM, 2, nil); err != nil {
			t.Fatal(err)
		}
	}
	warm := gcache.Stats()[tiers.VRAM]
	rcache, _ := tiers.New(tiers.Config{RAM: m.TotalSize, Disk: src})
	defer rcache.Close()
	rm, err := NewRefModel(ctx, m, rcache)
	if err != nil {
		t.Fatal(err)
	}
	tok := int('T')
	worst := 0.0
	for step := 0; step < 32; step++ {
		gl, err := g.Step(ctx, tok)
		if err != nil {
			t.Fatal(err)
		}
		rl, err := rm.Step(ctx, tok)
		if err != nil {
			t.Fatal(err)
		}
		scale := 0.0
		for _, v := range rl {
			scale = math.Max(scale, math.Abs(v))
		}
		for i := range rl {
			if diff := math.Abs(float64(gl[i])-rl[i]) / scale; diff > worst {
				worst = diff
			}
		}
		gt, rt := argmax32(gl), ref.Argmax(rl)
		if gt != rt {
			// Only a near tie may differ.
			if math.Abs(rl[gt]-rl[rt]) > 1e-3*scale {
				t.Fatalf("step %d: GPU token %d, reference %d (logits %g vs %g)", step, gt, rt, rl[gt], rl[rt])
			}
		}
		tok = rt
	}
	// Tolerance: Q4_K matvecs accumulate in float32 on the GPU; the
	// reference is float64. Relative to the largest logit.
	const tol = 1e-3
	if worst > tol {
		t.Fatalf("largest logit difference %.2e of the largest logit; tolerance %.0e", worst, tol)
	}
	vr := gcache.Stats()[tiers.VRAM].Since(warm)
	moe := 0
	for l := range m.Config.NumHiddenLayers {
		if m.Config.IsMoE(l) {
			moe++
		}
	}
	pr := g.Profile
	if resident {
		// Every MoE layer ran masked, each step one submit and one
		// read-back, and every chosen matrix was counted as a VRAM hit.
		if pr.MaskedLayers != 32*moe || pr.Readbacks != 32 || pr.Submits != 32*(1+moe/maskedPerSubmit) {
			t.Fatalf("resident: %d of %d layers masked, %d read-backs and %d submits in 32 steps", pr.MaskedLayers, 32*moe, pr.Readbacks, pr.Submits)
		}
		if want := int64(32 * moe * 3 * m.Config.NumExpertsPerTok); vr.Hits != want || vr.Misses != 0 || vr.Evictions != 0 {
			t.Fatalf("resident: VRAM %d hits (want %d), %d misses, %d evictions", vr.Hits, want, vr.Misses, vr.Evictions)
		}
		t.Logf("32 steps, all %d MoE layers masked: worst logit difference %.2e of the largest", moe, worst)
		return
	}
	if vr.Evictions == 0 {
		t.Fatalf("VRAM level: %d hits, %d misses, no evictions: paging did not happen", vr.Hits, vr.Misses)
	}
	t.Logf("32 steps: worst logit difference %.2e of the largest; VRAM hit rate %.2f, %d evictions", worst, vr.HitRate, vr.Evictions)
}

// Next-layer prefetch changes no token, and its guesses are right more
// often than chance (top-2 of 8: 25%).
func TestGPUModelPrefetch(t *testing.T) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	}
	var o gpu.Options
	if s := os.Getenv("RDRR_GPU_BACKEND"); s != "" {
		o.Backend, _ = gpu.ParseBackend(s)
	}
	d, err := gpu.Open(context.Background(), o)
	if err != nil {
		t.Fatalf("no GPU adapter: %v", err)
	}
	defer d.Close()
	m, src := tinyInStore(t, 1)
	ctx := context.Background()
	run := func(prefetch bool) ([]int, *GPUModel) {
		arena, err := tiers.NewGPUArena(d, ExpertMatrixBytes(m), 3*len(m.Experts)/4, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(arena.Release)
		cache, err := tiers.New(tiers.Config{RAM: m.TotalSize, Arena: arena, Disk: src})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cache.Close() })
		g, err := NewGPUModel(ctx, m, d, cache, arena, 64)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		g.Prefetch = prefetch
		toks, err := g.Generate(ctx, ByteTokens("The swarm is"), 16, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return toks, g
	}
	plain, _ := run(false)
	pre, g := run(true)
	if !slices.Equal(plain, pre) {
		t.Fatalf("tokens with prefetch %v; without %v", pre, plain)
	}
	acc := float64(g.Correct) / float64(g.Predicted)
	if g.Predicted == 0 || acc <= 0.25 {
		t.Fatalf("prefetch accuracy %d/%d", g.Correct, g.Predicted)
	}
	t.Logf("next-layer prefetch: %d of %d guesses right (%.2f)", g.Correct, g.Predicted, acc)
}

func argmax32(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
