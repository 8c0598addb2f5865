package experts

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/tiers"
)

// TestGPUModelFusedFFN: a resident MoE layer's gate, up and down
// products in one dispatch (fusedFFN, ops.Q4KFFN) give the logits of the
// two masked dispatches bit for bit, step after step, on a shape the
// kernel takes: tiny-moe's with a hidden size of 512 and experts 1024
// wide (tiny-moe's own, 256 and 512, is too small for its layouts, and
// runs the masked dispatches), every layer's matrices in one GPU buffer
// of several; and paged, half of the matrices in VRAM.
func TestGPUModelFusedFFN(t *testing.T) {
	moe, err := PresetByName("tiny-moe")
	if err != nil {
		t.Fatal(err)
	}
	if ops.CanFFN(moe.Config.HiddenSize, moe.Config.ExpertFFN(), moe.Config.NumExpertsPerTok) {
		t.Fatalf("tiny-moe's shape takes the fused kernel: this test's wider shape is not needed")
	}
	wide := Preset{Name: "tiny-moe-wide", Config: moe.Config}
	wide.Config.HiddenSize, wide.Config.IntermediateSize, wide.Config.NumAttentionHeads = 512, 1024, 8
	c := wide.Config
	if !ops.CanFFN(c.HiddenSize, c.ExpertFFN(), c.NumExpertsPerTok) {
		t.Fatalf("hidden %d, FFN %d: not a shape the fused kernel takes", c.HiddenSize, c.ExpertFFN())
	}
	m, src := shapeInStore(t, wide, 1)
	// Banks (GPU buffers) of 40 slots, 160 in all: a layer's 24 matrices
	// fit a bank whole only if it keeps them together (groupExperts: its
	// gate and up apart from its down would put the second layer's down
	// matrices in another bank than its gate and up).
	d := openTestDevice(t, 40*uint64(ExpertMatrixBytes(m)))
	ctx := context.Background()
	run := func(on bool, slots int) (logits [][]float32, fused int) {
		t.Setenv("RDRR_GPU_FFN", map[bool]string{true: "1", false: "0"}[on])
		g, cache := testGPUModel(t, d, m, src, slots)
		if on && !g.canFuseFFN() {
			t.Skip("the forms the fused kernel needs are off in the environment (RDRR_GPU_XQ, RDRR_GPU_YQ, RDRR_GPU_GLU, RDRR_GPU_FUSE, RDRR_GPU_NORM)")
		}
		level := tiers.VRAM
		if slots < ExpertMatrices(m) {
			level = tiers.RAM
		}
		if err := cache.Warm(ctx, g.ExpertKeys(), level, 2, nil); err != nil {
			t.Fatal(err)
		}
		tok := int('R')
		for range 8 {
			lg, err := g.Step(ctx, tok)
			if err != nil {
				t.Fatal(err)
			}
			logits = append(logits, slices.Clone(lg))
			tok = slices.Index(lg, slices.Max(lg))
		}
		return logits, g.ffnRecorded
	}
	same := func(what string, on, off [][]float32) {
		t.Helper()
		for s := range on {
			for i := range on[s] {
				if math.Float32bits(on[s][i]) != math.Float32bits(off[s][i]) {
					t.Fatalf("%s, step %d: logit %d = %v fused; %v from the masked dispatches", what, s, i, on[s][i], off[s][i])
				}
			}
		}
	}
	on, fused := run(true, 160)
	off, masked := run(false, 160)
	if want := 8 * c.NumHiddenLayers; fused != want || masked != 0 {
		t.Fatalf("fused FFN dispatches: %d with it on (want %d: one a layer and step), %d off", fused, want, masked)
	}
	same("resident", on, off)
	// Half of the matrices in VRAM: layers paged, their resident experts'
	// products recorded apart from the misses'.
	on, pagedFused := run(true, ExpertMatrices(m)/2)
	off, _ = run(false, ExpertMatrices(m)/2)
	if pagedFused == 0 {
		t.Fatalf("paged: no fused FFN dispatch (the resident experts of a paged layer run fused too: 20 of 32 here when written)")
	}
	same("paged", on, off)

	// A workgroup that gave up waiting (the counters' fourth word) fails
	// the generation.
	t.Setenv("RDRR_GPU_FFN", "1")
	g, cache := testGPUModel(t, d, m, src, 160)
	if err := cache.Warm(ctx, g.ExpertKeys(), tiers.VRAM, 2, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Generate(ctx, ByteTokens("Hi"), 3, Sampling{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Write(g.ffnCounters, gpu.Bytes([]uint32{0, 0, 0, 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Generate(ctx, ByteTokens("Hi"), 3, Sampling{}, nil); err == nil || !strings.Contains(err.Error(), "RDRR_GPU_FFN=0") {
		t.Fatalf("a give-up flag in the counters: %v; want an error that names RDRR_GPU_FFN=0", err)
	}
}
