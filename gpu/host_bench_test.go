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
// this says whether the count or the bytes cost. RDRR_BENCH_HOST_MIB sets
// the total (default 24 GiB on a GPU, 256 MiB on a CPU adapter).
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
	round := func() time.Duration {
		t0 := time.Now()
		for range 9 {
			bt := d.Batch()
			if err := bt.Copy(dst, src); err != nil {
				b.Fatal(err)
			}
			if err := bt.Submit(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	median := func() float64 {
		for range 3 {
			round()
		}
		var ts []float64
		for range 21 {
			ts = append(ts, float64(round().Microseconds()))
		}
		slices.Sort(ts)
		return ts[len(ts)/2]
	}
	for i := 0; i < b.N; i++ {
		none := median()
		b.ReportMetric(none, "us-none")
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
			with := median()
			tag := fmt.Sprintf("%dx%dMiB", len(hs), per>>20)
			b.ReportMetric(float64(alloc.Milliseconds())/float64(max(1, len(hs))), "alloc-ms-each-"+tag)
			b.ReportMetric(with, "us-"+tag)
			b.ReportMetric(with/none, "x-of-none-"+tag)
			for _, h := range hs {
				h.Release()
			}
		}
	}
}
