package gpu

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkWait: how late a wait for the GPU learns that its work is done.
// A round trip is one small copy submitted and waited for with Sync (what
// every read-back, Sync and staging-buffer return goes through: the
// device's poller). The baseline is the same copy waited for by wgpu
// itself, blocked on the fence (the earliest the host can know without
// spinning; spinning would also steal lavapipe's cores); late-us is the
// difference, x-of-fence the ratio (1 is no delay). Medians of 31 round
// trips each, alternated. A copy of 64 KiB is a short wait; one of 16 MiB
// a longer one; 32 of them in one submission a wait as long as a paged
// decode step's for its router's choice, several hundred microseconds (the
// poller's sleeps have grown to their longest, unless a waiter keeps
// them short).
func BenchmarkWait(b *testing.B) {
	for _, c := range []struct {
		size   uint64
		copies int
	}{{64 << 10, 1}, {16 << 20, 1}, {16 << 20, 32}} {
		b.Run(fmt.Sprintf("copy=%dKiBx%d", c.size>>10, c.copies), func(b *testing.B) { benchWait(b, c.size, c.copies) })
	}
}

func benchWait(b *testing.B, size uint64, copies int) {
	ctx := context.Background()
	d := shared.d
	src, err := d.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Release()
	dst, err := d.Alloc(size)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Release()
	submit := func() {
		bt := d.Batch()
		for range copies {
			if err := bt.Copy(dst, src); err != nil {
				b.Fatal(err)
			}
		}
		if err := bt.Submit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		const n = 31
		var synced, fenced []time.Duration
		for range n {
			t0 := time.Now()
			submit()
			if err := d.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			synced = append(synced, time.Since(t0))

			t0 = time.Now()
			submit()
			d.dev.Poll(true, nil) // wgpu waits on the fence (fine for milliseconds: see pollLoop)
			fenced = append(fenced, time.Since(t0))
			if err := d.Sync(ctx); err != nil { // the poller's view catches up
				b.Fatal(err)
			}
		}
		s, p := medianDuration(synced), medianDuration(fenced)
		b.ReportMetric(float64(s.Microseconds()), "sync-us")
		b.ReportMetric(float64(p.Microseconds()), "fence-us")
		b.ReportMetric(float64((s - p).Microseconds()), "late-us")
		b.ReportMetric(float64(s)/float64(p), "x-of-fence")
	}
}
