package experts

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/tiers"
)

// BenchmarkGenerateGPU decodes tiny-moe on the GPU engine twice in one
// run: every expert resident (warmed into VRAM first), and with a VRAM
// arena of a quarter of the expert matrices (paging and evicting, with
// next-layer prefetch). It reports both tok/s and the paged run as a
// ratio of the resident one, the baseline measured in the same run; and
// of the resident run its steady state (the median step's tok/s) and its
// dispatches a step and those after a barrier (gpu's model of wgpu's).
func BenchmarkGenerateGPU(b *testing.B) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		b.Setenv("XDG_RUNTIME_DIR", b.TempDir())
	}
	var o gpu.Options
	if s := os.Getenv("RDRR_GPU_BACKEND"); s != "" {
		o.Backend, _ = gpu.ParseBackend(s)
	}
	d, err := gpu.Open(context.Background(), o)
	if err != nil {
		b.Skipf("no GPU adapter: %v", err)
	}
	defer d.Close()
	m, src := presetInStore(b, "tiny-moe", 1)
	ctx := context.Background()
	const tokens = 24
	var steady, dispatches, barriers float64 // of the resident run
	run := func(slots int, warm bool) float64 {
		arena, err := tiers.NewGPUArena(d, ExpertMatrixBytes(m), slots, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer arena.Release()
		cache, err := tiers.New(tiers.Config{RAM: m.TotalSize, Arena: arena, Disk: src})
		if err != nil {
			b.Fatal(err)
		}
		defer cache.Close()
		g, err := NewGPUModel(ctx, m, d, cache, arena, 64)
		if err != nil {
			b.Fatal(err)
		}
		defer g.Close()
		g.Prefetch = true
		if err := cache.Warm(ctx, g.ExpertKeys(), tiers.RAM, 2, nil); err != nil {
			b.Fatal(err)
		}
		if warm {
			if err := cache.Warm(ctx, g.ExpertKeys(), tiers.VRAM, 2, nil); err != nil {
				b.Fatal(err)
			}
		}
		prompt := ByteTokens("The swarm is")
		st := d.Stats()
		t := time.Now()
		out, err := g.Generate(ctx, prompt, tokens, Sampling{}, nil)
		if err != nil {
			b.Fatal(err)
		}
		tps := float64(len(prompt)+len(out)) / time.Since(t).Seconds()
		if warm {
			steps := float64(g.Profile.Steps)
			st2 := d.Stats()
			dispatches, barriers = float64(st2.Dispatches-st.Dispatches)/steps, float64(st2.Barriers-st.Barriers)/steps
			if med, n := g.StepMedian(); n > 0 {
				steady = 1 / med.Seconds()
			}
		}
		return tps
	}
	all := 3 * len(m.Experts)
	var resident, paged float64
	for range b.N {
		resident = run(all, true)
		paged = run(all/4, false)
	}
	b.ReportMetric(resident, "resident-tok/s")
	b.ReportMetric(paged, "25%-vram-tok/s")
	b.ReportMetric(paged/resident, "x-of-resident")
	b.ReportMetric(steady, "resident-steady-tok/s")
	b.ReportMetric(dispatches, "dispatches/step")
	b.ReportMetric(barriers, "barriers/step")
}
