package gpu

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// BenchmarkHostBuffers measures what live, sealed host buffers cost work
// that does not touch them: a round of 9 submissions (each a 16 MiB copy
// between device buffers, as a decode step submits 9 times) and a Sync,
// with no host buffers, then with the same total in many small ones and in
// a few large ones, each as a ratio of the round without any, measured in
// the same run (x-of-none: 1 is free). On the H100 a RAM level of 768
// host buffers slowed every decode step by ~8.5 ms (tiers/BENCHMARKS.md);
// this says whether the count or the bytes cost, and whether the cost is
// per submission: the same 9 copies in one submission (one-), and 9
// submissions of a 4 KiB copy (small-). RDRR_BENCH_HOST_MIB sets the total
// (default 24 GiB on a GPU, 256 MiB on a CPU adapter).
func BenchmarkHostBuffers(b *testing.B) {
	d := openDevice(b, Options{MaxBufferSize: 1 << 30})
	ctx := context.Background() // allocating 24 GiB of host buffers outlasts a test's context
	total := uint64(24 << 30)
	if d.Info().Type == "cpu" {
		total = 256 << 20
	}
	if s := os.Getenv("RDRR_BENCH_HOST_MIB"); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil && v > 0 {
			total = v << 20
		}
	}
	src, err := d.Alloc(16 << 20)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := d.Alloc(16 << 20)
	if err != nil {
		b.Fatal(err)
	}
	// round submits 9 copies of n bytes in subs submissions and syncs.
	round := func(subs int, n uint64) time.Duration {
		t0 := time.Now()
		bt := d.Batch()
		for i := range 9 {
			if err := bt.Copy(dst.Sub(0, n), src.Sub(0, n)); err != nil {
				b.Fatal(err)
			}
			if (i+1)%(9/subs) == 0 {
				if err := bt.Submit(ctx); err != nil {
					b.Fatal(err)
				}
				bt = d.Batch()
			}
		}
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	type shape struct {
		name string
		subs int
		n    uint64
	}
	shapes := []shape{{"", 9, 16 << 20}, {"one-", 1, 16 << 20}, {"small-", 9, 4 << 10}}
	median := func(sh shape) float64 {
		for range 3 {
			round(sh.subs, sh.n)
		}
		var ts []float64
		for range 21 {
			ts = append(ts, float64(round(sh.subs, sh.n).Microseconds()))
		}
		slices.Sort(ts)
		return ts[len(ts)/2]
	}
	for i := 0; i < b.N; i++ {
		none := map[string]float64{}
		for _, sh := range shapes {
			none[sh.name] = median(sh)
			b.ReportMetric(none[sh.name], "us-"+sh.name+"none")
		}
		for _, per := range []uint64{32 << 20, 1 << 30} {
			per = min(per, total)
			var hs []*HostBuffer
			t0 := time.Now()
			for n := uint64(0); n+per <= total; n += per {
				h, err := d.AllocHost(per)
				if err != nil {
					b.Logf("host buffers of %d MiB: %d allocated: %v", per>>20, len(hs), err)
					break
				}
				if err := h.Seal(); err != nil {
					b.Fatal(err)
				}
				hs = append(hs, h)
			}
			alloc := time.Since(t0)
			tag := fmt.Sprintf("%dx%dMiB", len(hs), per>>20)
			b.ReportMetric(float64(alloc.Milliseconds())/float64(max(1, len(hs))), "alloc-ms-each-"+tag)
			for _, sh := range shapes {
				with := median(sh)
				b.ReportMetric(with, "us-"+sh.name+tag)
				b.ReportMetric(with/none[sh.name], "x-of-none-"+sh.name+tag)
			}
			for _, h := range hs {
				h.Release()
			}
		}
	}
}
