package gpu

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSubmit measures what a queue submission boundary costs the
// GPU, apart from the host: the same 128 copies of 16 MiB (each after the
// one before, a barrier between, like a decode step's chain), encoded
// beforehand into 16 batches, then handed to the queue as 16 submissions
// (SubmitEncoded once a batch), as one submission of 16 command buffers,
// or encoded as one batch and submitted once (the baseline); and as 16
// batches recorded and submitted one after another (Submit; the host
// records the next while the GPU runs the one before), or each with a
// 4-byte read-back in its submission (SubmitRead, as a decode step
// ends), and the same with 32 KiB written by queue.WriteBuffer before
// each submit (about a step's params: 293 dispatches at 64-byte alignment). Each is
// timed from its first submit to the Sync that sees it done; medians of
// 15, the three alternated. per-boundary-us is what each of the 15
// boundaries adds to the baseline; x-of-one the ratio to it. A decode
// step is one submission (Batch.SubmitRead): what two steps in one
// submission could save is this boundary.
func BenchmarkSubmit(b *testing.B) {
	ctx := context.Background()
	d := shared.d
	const copies, batches = 128, 16
	size := uint64(16 << 20)
	if d.Info().Type == "cpu" {
		size = 1 << 20 // lavapipe: the host's cores are its GPU, so this measures little
	}
	alloc := func() *Buffer {
		buf, err := d.Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(buf.Release)
		return buf
	}
	src, dst := alloc(), alloc()
	params := alloc()
	blob := make([]byte, 32<<10)
	// record is a batch of the chain's copies split n ways.
	record := func(n int) *Batch {
		bt := d.Batch()
		for range copies / n {
			if err := bt.Copy(dst, src); err != nil {
				b.Fatal(err)
			}
		}
		return bt
	}
	encode := func(n int) []*Encoded {
		var es []*Encoded
		for range n {
			e, err := record(n).Encode(ctx)
			if err != nil {
				b.Fatal(err)
			}
			es = append(es, e)
		}
		return es
	}
	run := func(mode string) time.Duration {
		if mode == "submit" || mode == "read" || mode == "write" {
			if err := d.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			var reads []*PendingRead
			for range batches {
				bt := record(batches)
				if mode == "submit" {
					if err := bt.Submit(ctx); err != nil {
						b.Fatal(err)
					}
					continue
				}
				if mode == "write" {
					// A decode step's params: ~300 dispatches' uniforms,
					// written with queue.WriteBuffer before its submit.
					if err := d.Write(params, blob); err != nil {
						b.Fatal(err)
					}
				}
				r, err := bt.SubmitRead(ctx, dst.Sub(0, 4), 4)
				if err != nil {
					b.Fatal(err)
				}
				reads = append(reads, r)
			}
			for _, r := range reads {
				if err := r.Wait(ctx, make([]byte, 4)); err != nil {
					b.Fatal(err)
				}
			}
			if err := d.Sync(ctx); err != nil {
				b.Fatal(err)
			}
			return time.Since(t0)
		}
		var es []*Encoded
		switch mode {
		case "one":
			es = encode(1)
		default:
			es = encode(batches)
		}
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if mode == "each" {
			for _, e := range es {
				if err := d.SubmitEncoded(ctx, e); err != nil {
					b.Fatal(err)
				}
			}
		} else if err := d.SubmitEncoded(ctx, es...); err != nil {
			b.Fatal(err)
		}
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	modes := []string{"one", "buffers", "each", "submit", "read", "write"}
	for b.Loop() {
		const n = 15
		times := map[string][]time.Duration{}
		run("one") // warm: the pipelines and pools
		for range n {
			for _, m := range modes {
				times[m] = append(times[m], run(m))
			}
		}
		one := medianDuration(times["one"])
		b.ReportMetric(float64(one.Microseconds()), "one-us")
		for _, m := range modes[1:] {
			t := medianDuration(times[m])
			b.ReportMetric(float64(t-one)/1e3/float64(batches-1), m+"-per-boundary-us")
			b.ReportMetric(float64(t)/float64(one), m+"-x-of-one")
		}
	}
}
