package experts

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
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
//
// Three arithmetics: by default every product reads its x quantized (xq
// and xqAttn), with RDRR_GPU_XQ=experts only the experts' products, and
// the reference quantizes the same inputs the same way
// (RefModel.QuantizedX, QuantizedQKV, QuantizedO, QuantizedHead); a value that lies on a
// rounding boundary may round either way in float32 and float64, which
// moves a product by one step of its group, so the tolerance is 2e-2 of
// the largest logit (measured: 1.5e-2 on lavapipe and 9.4e-3 on an H200
// with every product quantized, the LM head's too, 1.1e-2 on lavapipe
// before it was;
// 3.5e-3 and 4.5e-3 with the experts' only, 3.7e-3 DeepSeek-style) and a
// token may differ only where the reference's top two are that close.
// The GPU must also be at least twice nearer that reference than the
// reference of float x (from which the logits are up to 0.29 of the
// largest apart with every product quantized, q k v's and o's quantized
// input turning routers' choices, and 0.016 with the experts' only).
// With RDRR_GPU_XQ=0 (exact activations) every product is float32
// against float64: 1e-3 (measured: below 5e-6).
func TestGPUModelMatchesReference(t *testing.T) {
	// -short (make test's run under the race detector) keeps the cases
	// marked short, one paged and one resident: the concurrency is the
	// same in all of them. env is set for the case; heap keeps the RAM
	// level in ordinary memory.
	for _, c := range []struct {
		name     string
		env      []string // name, value, ...
		preset   string
		maxBuf   uint64
		resident bool
		short    bool
		heap     bool
	}{
		// The o product adding into the residual and the down products
		// reading SwiGLU themselves (off by default; see fuseO).
		{name: "fused forms", env: []string{"RDRR_GPU_FUSE", "1"}, preset: "tiny-moe", resident: true},
		// The norms handed from the accumulates to the products
		// (partNorm, off by default), every expert resident and a
		// quarter paged.
		{name: "norms handed over, resident", env: []string{"RDRR_GPU_NORM", "1"}, preset: "tiny-moe", resident: true},
		{name: "norms handed over, paged", env: []string{"RDRR_GPU_NORM", "1"}, preset: "tiny-moe"},
		{name: "one arena buffer", preset: "tiny-moe"},
		// The accumulates into x as dispatches of their own (accNorm off:
		// by default each goes into the norm of x after it).
		{name: "accumulates apart, resident", env: []string{"RDRR_GPU_ACCNORM", "0"}, preset: "tiny-moe", resident: true},
		{name: "accumulates apart, paged", env: []string{"RDRR_GPU_ACCNORM", "0"}, preset: "tiny-moe"},
		{name: "accumulates apart, experts quantized, deepseek-style", env: []string{"RDRR_GPU_ACCNORM", "0", "RDRR_GPU_XQ", "experts"}, preset: "tiny-deepseek"},
		// Only the experts' x quantized, q k v's and o's float
		// (RDRR_GPU_XQ=experts), and the gate and up products' output
		// quantized by a dispatch of its own (RDRR_GPU_YQ=0).
		{name: "experts quantized, resident", env: []string{"RDRR_GPU_XQ", "experts"}, preset: "tiny-moe", resident: true},
		{name: "experts quantized, paged", env: []string{"RDRR_GPU_XQ", "experts"}, preset: "tiny-moe"},
		{name: "experts quantized, deepseek-style", env: []string{"RDRR_GPU_XQ", "experts"}, preset: "tiny-deepseek"},
		{name: "output quantized apart, resident", env: []string{"RDRR_GPU_YQ", "0"}, preset: "tiny-moe", resident: true},
		// The router after the FFN norm, reading its output (routeNorm
		// off: by default it runs beside the norm, normalizing x + o
		// itself).
		{name: "router after the norm, resident", env: []string{"RDRR_GPU_ROUTENORM", "0"}, preset: "tiny-moe", resident: true},
		{name: "router after the norm, paged", env: []string{"RDRR_GPU_ROUTENORM", "0"}, preset: "tiny-moe"},
		// Exact activations: the expert products of float x.
		{name: "exact, paged", env: []string{"RDRR_GPU_XQ", "0"}, preset: "tiny-moe"},
		{name: "exact, resident", env: []string{"RDRR_GPU_XQ", "0"}, preset: "tiny-moe", resident: true},
		// Gate and up as separate products with a SwiGLU dispatch (the
		// form before GLU, kept for measurements): paged, so that both
		// the masked products of the resident experts and the paged
		// ones' run in it.
		{name: "without GLU", env: []string{"RDRR_GPU_GLU", "0"}, preset: "tiny-moe"},
		{name: "RAM in ordinary memory", preset: "tiny-moe", heap: true},
		// 256 KiB buffers: 3 expert matrices per arena buffer, so a
		// layer's experts are spread over buffers and run one by one.
		{name: "arena over several buffers", preset: "tiny-moe", maxBuf: 256 << 10, short: true},
		// A dense first layer, a shared expert, sigmoid group-limited top-4.
		{name: "deepseek-style", preset: "tiny-deepseek"},
		// Every expert resident (warmed into VRAM first): every MoE layer
		// runs masked, the router's choice staying on the GPU, one
		// read-back a step.
		{name: "resident", preset: "tiny-moe", resident: true},
		{name: "resident, arena over several buffers", preset: "tiny-moe", maxBuf: 256 << 10, resident: true},
		{name: "resident deepseek-style", preset: "tiny-deepseek", resident: true, short: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && !c.short {
				t.Skip("short: one paged and one resident case run")
			}
			for i := 0; i+1 < len(c.env); i += 2 {
				t.Setenv(c.env[i], c.env[i+1])
			}
			if c.heap {
				heapRAM = true
				defer func() { heapRAM = false }()
			}
			testGPUModelMatches(t, c.preset, c.maxBuf, c.resident)
		})
	}
}

func testGPUModelMatches(t *testing.T, preset string, maxBuf uint64, resident bool) {
	d := openTestDevice(t, maxBuf)
	m, src := presetInStore(t, preset, 1)
	ctx := context.Background()
	slots := 3 * len(m.Experts) / 4
	if resident {
		slots = 3 * len(m.Experts)
	}
	g, gcache := testGPUModel(t, d, m, src, slots)
	if want := os.Getenv("RDRR_GPU_NORM") == "1"; g.partNorm != want {
		t.Fatalf("norms handed over: %v, RDRR_GPU_NORM %q", g.partNorm, os.Getenv("RDRR_GPU_NORM"))
	}
	if want := os.Getenv("RDRR_GPU_GLU") != "0" && !g.fuseSwiGLU; g.glu != want {
		t.Fatalf("gate and up together: %v, RDRR_GPU_GLU %q", g.glu, os.Getenv("RDRR_GPU_GLU"))
	}
	if want := os.Getenv("RDRR_GPU_XQ") != "0" && g.glu && !g.partNorm; g.xq != want {
		t.Fatalf("quantized x: %v, RDRR_GPU_XQ %q", g.xq, os.Getenv("RDRR_GPU_XQ"))
	}
	if want := g.xq && os.Getenv("RDRR_GPU_XQ") != "experts"; g.xqAttn != want {
		t.Fatalf("the attention's products of quantized x: %v, RDRR_GPU_XQ %q", g.xqAttn, os.Getenv("RDRR_GPU_XQ"))
	}
	for l := range m.Config.NumHiddenLayers {
		want := os.Getenv("RDRR_GPU_ROUTENORM") != "0" && g.xq && g.accNorm && g.fuseRouter && !g.fuseO && m.Config.IsMoE(l) && canRouteNorm(&m.Config)
		if g.routesBeside(l) != want {
			t.Fatalf("layer %d: the router beside the FFN norm %v; want %v", l, g.routesBeside(l), want)
		}
	}
	if want := os.Getenv("RDRR_GPU_ACCNORM") != "0"; g.accNorm != want {
		t.Fatalf("accumulates in the norms: %v, RDRR_GPU_ACCNORM %q", g.accNorm, os.Getenv("RDRR_GPU_ACCNORM"))
	}
	// Tolerances (see TestGPUModelMatchesReference): of the logits, and
	// of how near the reference's top two are where a token may differ.
	tol, tie := 1e-3, 1e-3
	if g.xq {
		tol, tie = 2e-2, 2e-2
	}
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
	compiles := d.Stats().Compiles
	rm := refModel(t, m, src)
	rm.QuantizedX, rm.QuantizedQKV = g.xq, g.xqAttn
	rm.QuantizedO = g.quantizedO()
	rm.QuantizedHead = g.quantizedHead()
	// With quantized x, the reference of float x too: the GPU must be
	// much nearer the reference that quantizes as it does than that one
	// (a product left float, or quantized where the mirror does not, would
	// not be).
	var plain *RefModel
	worstPlain := 0.0
	if g.xq {
		plain = refModel(t, m, src)
	}
	// The reference follows the GPU's choice of experts through near-ties
	// (within the tokens' tie tolerance): float32 and float64 sums, or a
	// value quantized one step apart, may turn them either way.
	var choices map[int][]int
	g.onChoice = func(l int, ids []int) { choices[l] = ids }
	rm.Follow = func(l int) []int { return choices[l] }
	rm.FollowTie = tie
	tok := int('T')
	worst := 0.0
	for step := 0; step < 32; step++ {
		choices = map[int][]int{}
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
		if plain != nil {
			pl, err := plain.Step(ctx, tok)
			if err != nil {
				t.Fatal(err)
			}
			for i := range pl {
				worstPlain = math.Max(worstPlain, math.Abs(float64(gl[i])-pl[i])/scale)
			}
		}
		for i := range rl {
			if diff := math.Abs(float64(gl[i])-rl[i]) / scale; diff > worst {
				worst = diff
			}
		}
		gt, rt := argmax32(gl), ref.Argmax(rl)
		if gt != rt {
			// Only a near tie may differ.
			if math.Abs(rl[gt]-rl[rt]) > tie*scale {
				t.Fatalf("step %d: GPU token %d, reference %d (logits %g vs %g)", step, gt, rt, rl[gt], rl[rt])
			}
		}
		tok = rt
	}
	if plain != nil {
		t.Logf("quantized x: %.2e from the reference of float x", worstPlain)
	}
	if rm.Followed > 0 {
		// The reference of float x does not follow (its choices differ
		// from the GPU's by more than rounding): past a followed tie it
		// drifts further, and the check above is easier to pass.
		t.Logf("the reference followed the GPU's choice through %d near-ties", rm.Followed)
	}
	// A near-tie is rare: many would say the router's input is off.
	if rm.Followed > 4 {
		t.Fatalf("the reference followed the GPU's choice through %d near-ties in 32 steps", rm.Followed)
	}
	// The load compiled every pipeline the steps use (compile's dry
	// recording), with the arena in one buffer; over several, products of
	// fewer experts a dispatch may take layouts of their own.
	if n := d.Stats().Compiles - compiles; n > 0 && maxBuf == 0 {
		t.Fatalf("%d pipelines compiled during the steps", n)
	}
	if plain != nil && worst > worstPlain/2 {
		t.Fatalf("largest logit difference %.2e from the reference that quantizes as the GPU does, %.2e from the one of float x: not the arithmetic it mirrors", worst, worstPlain)
	}
	// Q4_K matvecs accumulate in float32 on the GPU; the reference is
	// float64. Relative to the largest logit.
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
		// Every MoE layer ran masked, each step one read-back, in the
		// submit of its last layers and head (one more every perSubmit
		// layers before), and every chosen matrix was counted as a VRAM
		// hit.
		if pr.MaskedLayers != 32*moe || pr.Readbacks != 32 || pr.Submits != 32*(1+(moe-1)/g.perSubmit) {
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
	if preset == "tiny-moe" && pr.Early == 0 {
		// Four MoE layers: layer 3's fixed part is encoded early whenever
		// layer 0 paged a matrix in, and taken as layer 3's ahead.
		t.Fatalf("no layer came with its fixed part encoded early in 32 paged steps (%d turns, %d with nothing paged in)", pr.Turns, pr.TurnsHit)
	}
	t.Logf("32 steps: worst logit difference %.2e of the largest; VRAM hit rate %.2f, %d evictions", worst, vr.HitRate, vr.Evictions)
}

// With routeNorm, a MoE layer's router normalizes x + o itself beside
// the FFN norm, which writes the layer's own buffers (x + o into its x2,
// read back into x by the next layer's norm): everything but the
// router's product keeps its bits (the norm's included), so wherever
// every layer chose the same experts as with the router after the norm,
// the logits differ only by what the router's own arithmetic (its row by
// (x + o) * g over the rms, its sums in another order) does to the
// experts' weights: at the first step within 1e-5 of the largest
// (measured on lavapipe: 3.5e-7 to 8.3e-7); later, through the KV cache and the
// 8-bit rounding of x, whose boundaries such differences may cross,
// within 2e-2 (the reference test's tolerance; measured: 8.7e-7 to
// 4.2e-3). The test logs both. A norm that read a stale
// x or x + o twice, or products that read another layer's norm, would be
// off by far more at the first step. Resident and paged
// (the paged step's router runs after the norm, reading the same x and
// o). 24 greedy steps on tiny-moe, every layer's choices compared; at
// least 16 steps must get that far (a near-tie of the two routers' sums
// may end it earlier).
//
// Also on a shape of no preset: tiny-moe's with softmax routing after a
// dense first layer (DeepSeek's first_k_dense_replace), whose load
// records a MoE layer's FFN norm after a dense layer's.
func TestGPUModelRouteNorm(t *testing.T) {
	moe, err := PresetByName("tiny-moe")
	if err != nil {
		t.Fatal(err)
	}
	dense := Preset{Name: "tiny-moe-dense-first", Config: moe.Config}
	dense.Config.FirstKDenseReplace = 1
	for _, c := range []struct {
		p        Preset
		resident bool
	}{{moe, true}, {moe, false}, {dense, true}} {
		resident := c.resident
		t.Run(fmt.Sprintf("%s,resident=%v", c.p.Name, resident), func(t *testing.T) {
			if testing.Short() && (!resident || c.p.Name != "tiny-moe") {
				t.Skip("short: tiny-moe resident only")
			}
			d := openTestDevice(t, 0)
			m, src := shapeInStore(t, c.p, 1)
			ctx := context.Background()
			slots := ExpertMatrices(m) / 4
			if resident {
				slots = ExpertMatrices(m)
			}
			type step struct {
				logits  []float32
				choices map[int][]int
			}
			barriers := map[bool]uint64{} // the steps' dispatches with a barrier before them (gpu's model of wgpu's), by on
			run := func(on bool, toks []int) (steps []step, next []int, g *GPUModel) {
				t.Setenv("RDRR_GPU_ROUTENORM", map[bool]string{true: "1", false: "0"}[on])
				g, cache := testGPUModel(t, d, m, src, slots)
				if !g.xq || !g.accNorm || !g.fuseRouter {
					t.Skip("the forms the router beside the norm needs are off in the environment (RDRR_GPU_XQ, RDRR_GPU_ACCNORM, RDRR_GPU_ROUTER)")
				}
				g.Prefetch = !resident
				if resident {
					if err := cache.Warm(ctx, g.ExpertKeys(), tiers.VRAM, 2, nil); err != nil {
						t.Fatal(err)
					}
				}
				for l := range m.Config.NumHiddenLayers {
					if g.routesBeside(l) != (on && m.Config.IsMoE(l)) {
						t.Fatalf("layer %d: the router beside the norm %v; want %v", l, g.routesBeside(l), on)
					}
				}
				var cur map[int][]int
				g.onChoice = func(l int, ids []int) { cur[l] = slices.Clone(ids) }
				before := d.Stats().Barriers
				defer func() { barriers[on] = d.Stats().Barriers - before }()
				tok := int('R')
				for i := range 24 {
					if toks != nil {
						tok = toks[i]
					}
					next = append(next, tok)
					cur = map[int][]int{}
					l, err := g.Step(ctx, tok)
					if err != nil {
						t.Fatal(err)
					}
					steps = append(steps, step{l, cur})
					tok = argmax32(l)
				}
				if pr := g.Profile; resident != (pr.Turns == 0) || resident && pr.MaskedLayers == 0 {
					t.Fatalf("resident %v: %d paged turns, %d masked layers", resident, pr.Turns, pr.MaskedLayers)
				}
				return steps, next, g
			}
			beside, toks, gb := run(true, nil)
			after, _, ga := run(false, toks)
			same := 0
			var worst [2]float64 // the first step's, the later steps'
			for i := range beside {
				if fmt.Sprint(beside[i].choices) != fmt.Sprint(after[i].choices) {
					break
				}
				if len(beside[i].choices) == 0 {
					t.Fatalf("step %d: no layer's choice seen", i)
				}
				tol := 2e-2
				if i == 0 {
					tol = 1e-5
				}
				big := 0.0
				for _, v := range after[i].logits {
					big = max(big, math.Abs(float64(v)))
				}
				for j := range beside[i].logits {
					d := math.Abs(float64(beside[i].logits[j] - after[i].logits[j]))
					if !(d <= tol*big) {
						t.Fatalf("step %d: logit %d %g beside the norm, %g after it (%.1e of the largest), with every layer's choice the same", i, j, beside[i].logits[j], after[i].logits[j], d/big)
					}
					worst[min(i, 1)] = max(worst[min(i, 1)], d/big)
				}
				same++
			}
			if same < 16 {
				t.Fatalf("only %d steps chose the same experts both ways", same)
			}
			// Resident, the norm runs beside the router: one barrier
			// fewer a masked layer than with the router after it.
			if n := gb.Profile.MaskedLayers; resident && (n == 0 || barriers[false]-barriers[true] != uint64(n)) {
				t.Fatalf("%d barriers with the router beside the norm, %d after it; want %d fewer (the masked layers)", barriers[true], barriers[false], n)
			}
			// The next layer's guesses (paged) normalize the same x + o
			// both ways (the layer's x2 with routeNorm): the same guesses,
			// leads and hits where every choice was the same.
			if !resident && same == len(beside) {
				if gb.Predicted == 0 || gb.Predicted != ga.Predicted || gb.Correct != ga.Correct || gb.Leads != ga.Leads {
					t.Fatalf("guesses beside the norm %d (%d right, by lead %v); after it %d (%d, %v)", gb.Predicted, gb.Correct, gb.Leads, ga.Predicted, ga.Correct, ga.Leads)
				}
			}
			t.Logf("%d of %d steps with the same choices and logits; worst logit difference %.1e of the largest at the first step, %.1e later", same, len(beside), worst[0], worst[1])
		})
	}
	// A model whose router cannot (sigmoid routing, a shared expert) runs
	// it after the norm and refuses the A/B of it.
	m, src := presetInStore(t, "tiny-deepseek", 1)
	g, _ := testGPUModel(t, openTestDevice(t, 0), m, src, ExpertMatrices(m))
	for l := range m.Config.NumHiddenLayers {
		if g.routesBeside(l) {
			t.Fatalf("tiny-deepseek layer %d: the router beside the norm", l)
		}
	}
	if err := g.SetAB("routenorm"); err == nil {
		t.Fatal("tiny-deepseek: SetAB(\"routenorm\") accepted")
	}
}

// A paged step computes what the resident step does, bit for bit: the
// same tokens give the same logits whichever experts were in VRAM (a
// quarter of them here, every layer paged, against all of them, every
// layer masked). Else which experts a cache happened to hold would change
// the router's choices at near-ties, and the tokens after them: a
// prompt's output would depend on the VRAM budget and on when prefetches
// landed. Both runs are fed the resident run's greedy tokens.
func TestGPUModelPagedSameBits(t *testing.T) {
	for _, preset := range []string{"tiny-moe", "tiny-deepseek"} {
		t.Run(preset, func(t *testing.T) {
			if testing.Short() && preset != "tiny-moe" {
				t.Skip("short: tiny-moe only")
			}
			d := openTestDevice(t, 0)
			m, src := presetInStore(t, preset, 1)
			ctx := context.Background()
			steps := func(slots int, toks []int) (logits [][]float32, next []int) {
				g, cache := testGPUModel(t, d, m, src, slots)
				if slots == ExpertMatrices(m) {
					if err := cache.Warm(ctx, g.ExpertKeys(), tiers.VRAM, 2, nil); err != nil {
						t.Fatal(err)
					}
				}
				tok := int('T')
				for i := range 24 {
					if toks != nil {
						tok = toks[i]
					}
					next = append(next, tok)
					l, err := g.Step(ctx, tok)
					if err != nil {
						t.Fatal(err)
					}
					logits = append(logits, l)
					tok = argmax32(l)
				}
				if pr := g.Profile; slots == ExpertMatrices(m) && pr.Turns != 0 || slots < ExpertMatrices(m) && pr.Turns == 0 {
					t.Fatalf("%d slots of %d: %d paged turns", slots, ExpertMatrices(m), pr.Turns)
				}
				return logits, next
			}
			resident, toks := steps(ExpertMatrices(m), nil)
			paged, _ := steps(ExpertMatrices(m)/4, toks)
			for i := range resident {
				n := 0
				for j := range resident[i] {
					if math.Float32bits(resident[i][j]) != math.Float32bits(paged[i][j]) {
						n++
					}
				}
				if n > 0 {
					t.Fatalf("step %d: %d of %d logits differ in their bits between the paged and the resident step", i, n, len(resident[i]))
				}
			}
		})
	}
}

// Next-layer prefetch, to VRAM or to RAM, changes no token, its guesses
// are right more often than chance (top-2 of 8: 25%), and they reach the
// level asked for.
func TestGPUModelPrefetch(t *testing.T) {
	d := openTestDevice(t, 0)
	m, src := tinyInStore(t, 1)
	ctx := context.Background()
	run := func(prefetch bool, to tiers.Level) ([]int, *GPUModel, *tiers.Cache) {
		g, cache := testGPUModel(t, d, m, src, 3*len(m.Experts)/4)
		g.Prefetch, g.PrefetchTo = prefetch, to
		toks, err := g.Generate(ctx, ByteTokens("The swarm is"), 16, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return toks, g, cache
	}
	plain, _, _ := run(false, tiers.VRAM)
	for _, to := range []tiers.Level{tiers.VRAM, tiers.RAM} {
		pre, g, cache := run(true, to)
		if !slices.Equal(plain, pre) {
			t.Fatalf("%v: tokens with prefetch %v; without %v", to, pre, plain)
		}
		acc := float64(g.Correct) / float64(g.Predicted)
		if g.Predicted == 0 || acc <= 0.25 {
			t.Fatalf("%v: prefetch accuracy %d/%d", to, g.Correct, g.Predicted)
		}
		st := cache.Stats()
		for _, l := range []tiers.Level{tiers.VRAM, tiers.RAM} {
			queued := st[l].PrefetchQueued
			if (l == to) != (queued > 0) {
				t.Fatalf("prefetch to %v: %d prefetches queued at %v", to, queued, l)
			}
		}
		// Leads splits the guesses, each guessed expert leading the others.
		var sum GuessCount
		for _, c := range g.Leads {
			sum.Guesses += c.Guesses
			sum.Right += c.Right
		}
		if sum.Guesses != g.Predicted || sum.Right != g.Correct {
			t.Fatalf("%v: guesses by lead add to %+v; %d guesses, %d right", to, sum, g.Predicted, g.Correct)
		}
		t.Logf("next-layer prefetch to %v: %d of %d guesses right (%.2f), by lead %v", to, g.Correct, g.Predicted, acc, g.Leads)
	}
	// To RAM, and the sure guesses to VRAM: a guess whose bucket was
	// ever right (after one guess) at the least rate there is, none at a
	// rate above 1.
	for _, sure := range []float64{1e-30, 1.5} {
		g, cache := testGPUModel(t, d, m, src, 3*len(m.Experts)/4)
		g.Prefetch, g.PrefetchTo, g.PrefetchSure, g.sureAfter = true, tiers.RAM, sure, 1
		toks, err := g.Generate(ctx, ByteTokens("The swarm is"), 16, Sampling{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(plain, toks) {
			t.Fatalf("sure guesses (%g) to VRAM: tokens %v; without prefetch %v", sure, toks, plain)
		}
		st := cache.Stats()
		if q := st[tiers.VRAM].PrefetchQueued; (sure < 1) != (q > 0) || st[tiers.RAM].PrefetchQueued == 0 && sure > 1 {
			t.Fatalf("PrefetchSure %g: %d prefetches queued at VRAM, %d at RAM", sure, q, st[tiers.RAM].PrefetchQueued)
		}
		// Each bucket counts the guesses it sent to VRAM among its own,
		// a prefetch a matrix; the last layer's guesses may go unscored.
		var nSure int
		slack := int64(len(m.Experts[0].Tensors) * m.Config.NumExpertsPerTok)
		for _, c := range g.Leads {
			if c.Sure > c.Guesses {
				t.Fatalf("PrefetchSure %g: buckets %v: more sure than guesses", sure, g.Leads)
			}
			nSure += c.Sure
		}
		per := int64(len(m.Experts[0].Tensors))
		if q := st[tiers.VRAM].PrefetchQueued; per*int64(nSure) < q-slack || per*int64(nSure) > q || (sure < 1) != (nSure > 0) {
			t.Fatalf("PrefetchSure %g: %d sure guesses counted, %d prefetches queued at VRAM", sure, nSure, q)
		}
	}
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

// Generate samples on the GPU (argmax or top-p over the logits it keeps
// there, one token read back): its tokens are the float64 reference's,
// greedy and at temperature 0.9 with top-p 0.8 under one seed, for 24
// tokens with a quarter of the experts in VRAM and all of them (masked
// layers). A top-p token may differ only where the reference's draw fell
// within 1e-5 of a boundary (f32 against float64): the comparison stops
// there, and at least half the tokens must have been compared. The
// expert products read float x (RDRR_GPU_XQ=0): a draw's margin of 1e-5
// is f32 against float64, which quantized x's rounding boundaries would
// pass (TestGPUModelMatchesReference checks those products).
func TestGPUModelSamples(t *testing.T) {
	t.Setenv("RDRR_GPU_XQ", "0")
	d := openTestDevice(t, 0)
	m, src := tinyInStore(t, 1)
	ctx := context.Background()
	prompt := ByteTokens("The swarm is")
	n := 24
	if raceEnabled && testing.Short() {
		n = 8 // the float64 reference is ten times slower under the race detector
	}
	// reference replays the reference engine with the draws Generate
	// makes, and returns its tokens and each draw's margin.
	reference := func(s Sampling) ([]int, []float64) {
		rm := refModel(t, m, src)
		var margins []float64
		toks, err := decode(ctx, m, nil, prompt, n, s, nil, func(ctx context.Context, tok int, dr *draw) (int, error) {
			logits, err := rm.Step(ctx, tok)
			if err != nil || dr == nil {
				return 0, err
			}
			if dr.temperature <= 0 {
				margins = append(margins, math.Inf(1))
				return ref.Argmax(logits), nil
			}
			next, margin := ref.TopP(logits, dr.temperature, dr.topP, dr.u)
			margins = append(margins, margin)
			return next, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return toks, margins
	}
	for _, c := range []struct {
		name     string
		s        Sampling
		resident bool
	}{
		{"greedy, paged", Sampling{}, false},
		{"greedy, resident", Sampling{}, true},
		{"top-p, paged", Sampling{Temperature: 0.9, TopP: 0.8, Seed: 7}, false},
		{"top-p, resident", Sampling{Temperature: 0.9, TopP: 0.8, Seed: 7}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && c.s.Temperature == 0 {
				t.Skip("short: the top-p cases only (greedy tokens are compared by TestGPUModelMatchesReference too)")
			}
			slots := len(m.Experts) * 3 / 4
			if c.resident {
				slots = 3 * len(m.Experts)
			}
			g, cache := testGPUModel(t, d, m, src, slots)
			if c.resident {
				if err := cache.Warm(ctx, g.ExpertKeys(), tiers.VRAM, 2, nil); err != nil {
					t.Fatal(err)
				}
			}
			got, err := g.Generate(ctx, prompt, n, c.s, nil)
			if err != nil {
				t.Fatal(err)
			}
			want, margins := reference(c.s)
			if len(got) != len(want) {
				t.Fatalf("%d tokens; the reference made %d", len(got), len(want))
			}
			same := 0
			for i := range want {
				if got[i] == want[i] {
					same++
					continue
				}
				if margins[i] >= 1e-5 {
					t.Fatalf("token %d: %d; the reference chose %d (margin %.3g)\ngot  %v\nwant %v", i, got[i], want[i], margins[i], got, want)
				}
				t.Logf("token %d: %d, the reference %d: its draw is %.3g from a boundary (f32 against float64); not compared further", i, got[i], want[i], margins[i])
				break
			}
			if same < n/2 {
				t.Fatalf("only %d of %d tokens compared", same, n)
			}
			if c.resident && g.Profile.MaskedLayers == 0 {
				t.Fatal("no layer ran masked with every expert in VRAM")
			}
			if g.Profile.Readbacks > g.Profile.Steps*(m.Config.NumHiddenLayers+1) {
				t.Fatalf("%d read-backs in %d steps", g.Profile.Readbacks, g.Profile.Steps)
			}
		})
	}
}

// openTestDevice opens the GPU the tests run on (RDRR_GPU_BACKEND, else
// the default; lavapipe here), its buffers at most maxBuf bytes (0: the
// device's limit); it closes with the test.
func openTestDevice(t *testing.T, maxBuf uint64) *gpu.Device {
	t.Helper()
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
	t.Cleanup(func() {
		// Cleanups run last first: every cache of the device has closed.
		if n := d.Stats().HostBuffers; n != 0 {
			t.Errorf("%d host buffers left after the caches closed", n)
		}
		d.Close()
	})
	return d
}

// heapRAM keeps the RAM level of a paged test model in ordinary memory
// (uploads through the staging ring) instead of pinned host memory.
var heapRAM bool

// testGPUModel makes m's GPU engine over an arena of slots expert
// matrices and a cache that holds all of m in RAM; both end with the test.
// As peer generate's --host-ram auto, the RAM level is in pinned host
// memory when the arena does not hold every expert matrix (unless heapRAM).
func testGPUModel(t *testing.T, d *gpu.Device, m *Manifest, src tiers.Source, slots int) (*GPUModel, *tiers.Cache) {
	t.Helper()
	arena, err := tiers.NewGPUArena(d, ExpertMatrixBytes(m), slots, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(arena.Release)
	hostRAM := slots < ExpertMatrices(m) && !heapRAM
	cache, err := tiers.New(tiers.Config{RAM: m.TotalSize, Arena: arena, Disk: src, HostRAM: hostRAM})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cache.Close() })
	g, err := NewGPUModel(context.Background(), m, d, cache, arena, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g, cache
}

// Generate records each step while the GPU runs the one before it
// (generatePipelined): its tokens, the expert trace, the cache's counts,
// the steps and the position it ends at are those of one step at a time,
// with every expert in VRAM (no step waits for the host), all but one
// (masked layers and paged ones in a step) and a quarter of them paged
// (a step ends the one before it before it pages),
// greedy and top-p, and when the text ends early (the end-of-text token
// chosen mid-way: the step begun after it is discarded).
func TestGPUModelPipelined(t *testing.T) {
	d := openTestDevice(t, 0)
	m, src := tinyInStore(t, 1)
	defer func(tk *Tokenizer) { m.Tokenizer = tk }(m.Tokenizer)
	ctx := context.Background()
	prompt := ByteTokens("The swarm is")
	n := 12
	type result struct {
		toks   []int
		trace  *tiers.Trace
		counts [][4]int64 // per level: hits, misses, evictions, bytes up
		steps  int
		masked int
		pos    int
	}
	// run generates with VRAM slots for every expert's matrices but
	// short experts', warmed with as many as fit.
	run := func(t *testing.T, pipeline bool, short int, s Sampling) result {
		slots := 3 * (len(m.Experts) - short)
		arena, err := tiers.NewGPUArena(d, ExpertMatrixBytes(m), slots, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer arena.Release()
		rec := &tiers.TraceRecorder{}
		cache, err := tiers.New(tiers.Config{RAM: m.TotalSize, Arena: arena, Disk: src, HostRAM: short > 0, Trace: rec})
		if err != nil {
			t.Fatal(err)
		}
		defer cache.Close()
		g, err := NewGPUModel(ctx, m, d, cache, arena, 64)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		g.pipeline, g.Trace = pipeline, rec
		if short < len(m.Experts)/4 {
			if err := cache.Warm(ctx, g.ExpertKeys()[:slots], tiers.VRAM, 2, nil); err != nil {
				t.Fatal(err)
			}
		}
		toks, err := g.Generate(ctx, prompt, n, s, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The trace knows each expert matrix's layer (Cache.SetGroup) and
		// every step's token (Cache.BeginStep): the prompt's, then each
		// generated token in the step after it, pipelined too (a step
		// begun ahead and not needed, after the end of the text, is not
		// told).
		tr := rec.Trace()
		group := map[string]int{}
		for _, k := range tr.Keys {
			group[k.Label] = k.Group
		}
		for _, ex := range m.Experts {
			for _, name := range ex.Tensors {
				k := g.matrixKey(name)
				if got, ok := group[fmt.Sprintf("%s:%d+%d", k.Blob, k.Off, k.Len)]; !ok || got != ex.Layer {
					t.Fatalf("%s: group %d in the trace (there: %v); want its layer %d", name, got, ok, ex.Layer)
				}
			}
		}
		embeds := append(slices.Clone(prompt), toks...)
		for step, tok := range tr.Tokens {
			if step >= len(embeds) || tok != embeds[step] {
				t.Fatalf("the trace says step %d embeds %d; it embeds %v", step, tok, embeds[min(step, len(embeds)-1)])
			}
		}
		if told := len(tr.Tokens); told != g.Profile.Steps {
			t.Fatalf("the cache was told the token of %d steps of %d", told, g.Profile.Steps)
		}
		var counts [][4]int64
		for _, st := range cache.Stats() {
			counts = append(counts, [4]int64{st.Hits, st.Misses, st.Evictions, st.BytesUp})
		}
		return result{toks, rec.Trace(), counts, g.Profile.Steps, g.Profile.MaskedLayers, g.pos}
	}
	// full is the trace of the resident run with s, one step at a time:
	// every matrix of every chosen expert, at its token.
	fulls := map[Sampling][]access{}
	full := func(t *testing.T, s Sampling) []access {
		if fulls[s] == nil {
			tk := m.Tokenizer
			m.Tokenizer = nil // the whole text
			fulls[s] = accesses(run(t, false, 0, s).trace)
			m.Tokenizer = tk
		}
		return fulls[s]
	}
	same := func(t *testing.T, short int, s Sampling) []int {
		one := run(t, false, short, s)
		piped := run(t, true, short, s)
		if !slices.Equal(one.toks, piped.toks) {
			t.Fatalf("tokens pipelined %v; one step at a time %v", piped.toks, one.toks)
		}
		// A paged layer's matrices are fetched concurrently: their
		// order within a token is not fixed, their token is.
		if one.steps != piped.steps || one.pos != piped.pos {
			t.Fatalf("pipelined: %d steps, position %d; one step at a time: %d steps, position %d", piped.steps, piped.pos, one.steps, one.pos)
		}
		if short == 0 {
			// Resident: every count is fixed.
			if !slices.Equal(accesses(one.trace), accesses(piped.trace)) {
				t.Fatalf("traces differ: %d accesses pipelined, %d one step at a time", len(piped.trace.Accesses), len(one.trace.Accesses))
			}
			if !slices.Equal(one.counts, piped.counts) || one.masked != piped.masked {
				t.Fatalf("pipelined: counts %v, %d masked; one step at a time: counts %v, %d masked", piped.counts, piped.masked, one.counts, one.masked)
			}
		} else {
			// Paged, which matrices VRAM evicts depends on the order of
			// concurrent fetches, and a masked layer's choice is counted
			// only if its matrices are still in VRAM when the step ends:
			// each run's trace holds what the resident run's does, at
			// the same tokens, less a few such choices.
			want := full(t, s)
			for _, r := range []result{one, piped} {
				got := accesses(r.trace)
				in := 0
				for _, a := range want {
					if a.token <= got[len(got)-1].token {
						in++
					}
				}
				for _, a := range got {
					if _, ok := slices.BinarySearchFunc(want, a, cmpAccess); !ok {
						t.Fatalf("token %d: %s, which no expert chosen at that token holds", a.token, a.label)
					}
				}
				if len(got) < in*9/10 {
					t.Fatalf("%d accesses of the %d the resident run made at the same tokens", len(got), in)
				}
			}
		}
		if short < len(m.Experts)/4 && piped.masked == 0 {
			t.Fatal("no layer ran masked")
		}
		if short > 0 && piped.masked >= piped.steps*m.Config.NumHiddenLayers {
			t.Fatalf("every layer ran masked with %d experts short", short)
		}
		t.Logf("%d experts short of all: %d layers of %d steps ran masked", short, piped.masked, piped.steps)
		return one.toks
	}
	for _, c := range []struct {
		name  string
		s     Sampling
		short int
	}{
		{"greedy, resident", Sampling{}, 0}, // the paths of top-p's cases, argmax at the end
		{"top-p, resident", Sampling{Temperature: 0.9, TopP: 0.8, Seed: 7}, 0},
		{"top-p, all experts but one in VRAM", Sampling{Temperature: 0.9, TopP: 0.8, Seed: 7}, 1},
		{"top-p, a quarter paged", Sampling{Temperature: 0.9, TopP: 0.8, Seed: 7}, len(m.Experts) / 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testing.Short() && (c.s.Temperature == 0 || c.short > 1) {
				t.Skip("short: top-p, resident and one expert short (the same paths: greedy differs in the last kernel, a quarter paged in how often a step pages)")
			}
			m.Tokenizer = nil
			toks := same(t, c.short, c.s)
			if len(toks) != n {
				t.Fatalf("%d tokens, asked for %d", len(toks), n)
			}
			// The end of the text: the first token not seen before it,
			// from the fourth on.
			at := -1
			for i := 3; i < n-1 && at < 0; i++ {
				if !slices.Contains(toks[:i], toks[i]) {
					at = i
				}
			}
			if at < 0 {
				t.Fatalf("no token to end the text with in %v", toks)
			}
			m.Tokenizer = &Tokenizer{Model: "byte", EOS: toks[at]}
			if got := same(t, c.short, c.s); len(got) != at+1 {
				t.Fatalf("the text ends at token %d (%d): %d tokens %v", at, toks[at], len(got), got)
			}
		})
	}
}

// An access is a trace's access by its token and its key's label (key
// ids are a cache's own).
type access struct {
	token int
	label string
}

func cmpAccess(a, b access) int {
	return cmp.Or(cmp.Compare(a.token, b.token), cmp.Compare(a.label, b.label))
}

// accesses returns tr's accesses, sorted: a paged layer fetches its
// matrices concurrently, so their order within a token is not fixed.
func accesses(tr *tiers.Trace) []access {
	out := make([]access, len(tr.Accesses))
	for i, a := range tr.Accesses {
		out[i] = access{a.Token, tr.Keys[a.Key].Label}
	}
	slices.SortFunc(out, cmpAccess)
	return out
}

// A guess's lead is its routing score less the best score of the experts
// not guessed: logits for a softmax router, sigmoids for a sigmoid one; a
// short read-back or an id past the experts guesses nothing.
func TestGuessLead(t *testing.T) {
	f32s := func(vs ...float32) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		return b
	}
	ids := func(es ...uint32) []byte {
		var b []byte
		for _, e := range es {
			b = binary.LittleEndian.AppendUint32(b, e)
		}
		return b
	}
	logits := f32s(2, -1, 0.5, 3)
	g := &GPUModel{m: &Manifest{Config: Config{NumExperts: 4}}}
	got := g.guessLead(ids(3, 0), logits)
	if len(got) != 2 || math.Abs(got[3]-2.5) > 1e-6 || math.Abs(got[0]-1.5) > 1e-6 {
		t.Fatalf("softmax: leads %v; want expert 3 by 2.5, expert 0 by 1.5", got)
	}
	if got := g.guessLead(ids(3, 9), logits); len(got) != 1 || math.Abs(got[3]-1) > 1e-6 {
		t.Fatalf("an id past the experts: leads %v; want expert 3 by 1 (over expert 0)", got)
	}
	if got := g.guessLead(ids(3, 0), logits[:8]); got != nil {
		t.Fatalf("logits of 2 of 4 experts: leads %v; want none", got)
	}
	g.m.Config.ScoringFunc = "sigmoid"
	sig := func(v float64) float64 { return 1 / (1 + math.Exp(-v)) }
	got = g.guessLead(ids(3, 0), logits)
	if math.Abs(got[3]-4*(sig(3)-sig(0.5))) > 1e-6 || math.Abs(got[0]-4*(sig(2)-sig(0.5))) > 1e-6 {
		t.Fatalf("sigmoid: leads %v; want four times the sigmoids' differences", got)
	}
	for _, c := range []struct {
		lead float64
		want int
	}{{-1, 0}, {0, 0}, {0.25, 1}, {0.9, 3}, {1.3, 5}, {3.99, 10}, {4, 11}, {100, 11}, {math.NaN(), 0}, {math.Inf(1), 11}} {
		if b := leadBucket(c.lead); b != c.want {
			t.Errorf("leadBucket(%g) = %d; want %d", c.lead, b, c.want)
		}
	}
}

// TestPrefetchSure: a guess is sure when its lead's bucket, counted
// SureAfter times or more, was right PrefetchSure of the time or more; a
// bucket not counted that often yet takes the nearest counted one below
// it; NaN (no lead) never is.
func TestPrefetchSure(t *testing.T) {
	g := &GPUModel{PrefetchSure: 0.9}
	b := leadBucket(1.6)
	g.Leads[b] = GuessCount{Guesses: SureAfter, Right: SureAfter * 9 / 10} // 28 of 32: 0.875
	if g.sure(1.6) {
		t.Fatalf("%+v sure at 0.9", g.Leads[b])
	}
	if g.PrefetchSure = 0.875; !g.sure(1.6) {
		t.Fatalf("%+v not sure at 0.875, its rate", g.Leads[b])
	}
	g.PrefetchSure = 0.9
	g.Leads[b].Right++ // 29 of 32: 0.906
	if !g.sure(1.6) || !g.sure(1.7) {
		t.Fatalf("%+v not sure at 0.9", g.Leads[b])
	}
	if !g.sure(1.8) || !g.sure(100) {
		t.Fatal("a bucket above a sure one, counted less than SureAfter, is not sure")
	}
	if g.sure(1.4) || g.sure(0) || g.sure(math.NaN()) {
		t.Fatal("sure below every counted bucket, or without a lead")
	}
	// A bucket above, counted enough, goes by its own rate.
	g.Leads[leadBucket(2.2)] = GuessCount{Guesses: SureAfter, Right: SureAfter / 2}
	if g.sure(2.2) || g.sure(3.5) || !g.sure(1.9) {
		t.Fatalf("buckets %v: 2.2 and 3.5 should follow 2-2.5's rate (0.5), 1.9 1.5-1.75's", g.Leads)
	}
	g.Leads[b] = GuessCount{Guesses: SureAfter - 1, Right: SureAfter - 1}
	if g.sure(1.6) {
		t.Fatalf("%+v sure: fewer than SureAfter guesses", g.Leads[b])
	}
	if g.sureAfter = SureAfter - 1; !g.sure(1.6) {
		t.Fatalf("%+v not sure with sureAfter %d", g.Leads[b], g.sureAfter)
	}
	g.sureAfter = 0
	g.Leads[b] = GuessCount{Guesses: SureAfter, Right: SureAfter}
	if g.PrefetchSure = 0; g.sure(1.6) {
		t.Fatal("sure with PrefetchSure 0")
	}
}

// ArenaSlots counts whole banks of whole layers where a layer's matrices
// fit one bank, as groupExperts places them.
func TestArenaSlots(t *testing.T) {
	layout := func(name string) *Manifest {
		p, err := PresetByName(name)
		if err != nil {
			t.Fatal(err)
		}
		lo, err := NewLayout(p, 1)
		if err != nil {
			t.Fatal(err)
		}
		return lo.Manifest
	}
	m := layout("mixtral-8x7b")
	for _, c := range []struct{ perBank, want int }{
		{68, 15*68 + 48},  // 2 layers of 24 a bank: 15 full banks, the last only as large as its 2 layers
		{72, 10*72 + 48},  // 3 a bank, nothing left over: the matrices
		{24, 32 * 24},     // 1 a bank: the matrices
		{100, 7*100 + 96}, // 4 a bank, 4 slots of each left over
		{23, 63*23 + 16},  // a layer does not fit a bank: groups of at most 16 (the down group is 8, counted as 16: an upper bound), one a bank
		{0, 768},
	} {
		if got := ArenaSlots(m, c.perBank); got != c.want {
			t.Errorf("ArenaSlots(Mixtral, %d a bank) = %d; want %d", c.perBank, got, c.want)
		}
	}
	// 58 MoE layers of 256 experts: 48 groups of 16 a layer, 2784 in all,
	// 16 in a bank of 260: 173 full banks and one of 16 groups.
	if got, want := ArenaSlots(layout("deepseek-v3-671b"), 260), 173*260+16*16; got != want {
		t.Errorf("ArenaSlots(DeepSeek-V3, 260 a bank) = %d; want %d", got, want)
	}
}
