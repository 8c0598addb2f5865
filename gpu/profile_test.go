package gpu

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// profiledSpin opens a device that can profile (skipping the test where
// the adapter has no timestamps), with the spin kernel and a buffer for
// it; all are closed when the test ends.
func profiledSpin(t *testing.T) (*Device, *Pipeline, *Buffer) {
	t.Helper()
	o := testOptions()
	o.Profile = true
	d, err := Open(ctxT(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if !d.Info().TimestampQuery {
		t.Skipf("%s has no timestamp-query feature", d.Info())
	}
	src, err := os.ReadFile("testdata/spin.wgsl")
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.Compile(ctxT(t), Kernel{Name: "spin", Source: string(src), Bindings: []Access{ReadWrite}, Params: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Release)
	out, err := d.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(out.Release)
	return d, p, out
}

// TestProfile times dispatches of two grids over two submissions and
// checks the profile's counts, its kernels and their grids, and that its
// times are nanoseconds: the span lies between a twentieth of the wall
// time (the spin kernel dominates it) and the wall time.
func TestProfile(t *testing.T) {
	if err := shared.d.StartProfile(); !errors.Is(err, ErrNoTimestamps) {
		t.Fatalf("StartProfile on a device opened without Options.Profile: %v; want ErrNoTimestamps", err)
	}
	d, p, out := profiledSpin(t)
	const iters = 20000
	spin := func(b *Batch, gx uint32) {
		if err := b.Dispatch(p, [3]uint32{gx, 1, 1}, Params{}.U32(iters).U32(gx), out); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := d.StartProfile(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	b := d.Batch()
	spin(b, 4)
	spin(b, 8)
	if err := b.Clear(out); err != nil { // a copy command between passes
		t.Fatal(err)
	}
	spin(b, 4)
	spin(b, 8)
	spin(b, 4)
	if err := b.Submit(ctx); err != nil {
		t.Fatal(err)
	}
	b = d.Batch()
	spin(b, 4)
	if err := b.Submit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	wall := time.Since(start)
	prof, err := d.StopProfile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wall %v; profile %+v", wall, prof)
	if prof.Submits != 2 || prof.Dispatches != 6 || prof.Untimed != 0 {
		t.Fatalf("%d submits, %d dispatches timed, %d untimed; want 2, 6, 0", prof.Submits, prof.Dispatches, prof.Untimed)
	}
	counts := map[[3]uint32]int{}
	var sum time.Duration
	for _, k := range prof.Kernels {
		if k.Kernel != "spin" || k.Total <= 0 {
			t.Fatalf("kernel entry %+v", k)
		}
		counts[k.Groups] += k.Count
		sum += k.Total
	}
	if len(prof.Kernels) != 2 || counts[[3]uint32{4, 1, 1}] != 4 || counts[[3]uint32{8, 1, 1}] != 2 {
		t.Fatalf("kernels %+v; want spin at 4 workgroups 4 times and at 8 twice", prof.Kernels)
	}
	if prof.Kernels[0].Total < prof.Kernels[1].Total {
		t.Fatalf("kernels not sorted by time: %+v", prof.Kernels)
	}
	if sum != prof.Busy {
		t.Fatalf("kernels sum to %v; busy %v", sum, prof.Busy)
	}
	if prof.Span > wall || prof.Span < wall/20 {
		t.Fatalf("span %v for a wall time of %v: timestamps are not nanoseconds", prof.Span, wall)
	}
	// Stopped: nothing is timed until the next StartProfile.
	if _, err := d.StopProfile(ctx); err == nil {
		t.Fatal("StopProfile twice: no error")
	}
	b = d.Batch()
	spin(b, 4)
	if err := b.Submit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.StartProfile(); err != nil {
		t.Fatal(err)
	}
	prof, err = d.StopProfile(ctx)
	if err != nil || prof.Submits != 0 || prof.Dispatches != 0 {
		t.Fatalf("a profile over no submission: %+v, %v", prof, err)
	}
	// Bounded: 3 dispatches a batch and 2 batches a profile get timestamps.
	defer func(a, b int) { maxProfiled, maxProfiledBatches = a, b }(maxProfiled, maxProfiledBatches)
	maxProfiled, maxProfiledBatches = 3, 2
	if err := d.StartProfile(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		b = d.Batch()
		for range 4 {
			spin(b, 1)
		}
		if err := b.Submit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	prof, err = d.StopProfile(ctx)
	if err != nil || prof.Submits != 2 || prof.Dispatches != 6 || prof.Untimed != 6 {
		t.Fatalf("bounded profile: %+v, %v; want 2 submits, 6 dispatches timed, 6 not", prof, err)
	}
}

// TestProfileIdle checks the profile's view across submissions: copies
// submitted on their own are timed under their kind, and the time the GPU
// waits for the host shows as Idle, charged to the work that ended the
// wait. The host sleeps between a synced batch and a read-back, so the GPU
// idles at least that long before the read-back's copy.
func TestProfileIdle(t *testing.T) {
	d, p, out := profiledSpin(t)
	ctx := ctxT(t)
	spin := func() {
		b := d.Batch()
		if err := b.Dispatch(p, [3]uint32{4, 1, 1}, Params{}.U32(2000).U32(4), out); err != nil {
			t.Fatal(err)
		}
		if err := b.Submit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.StartProfile(); err != nil {
		t.Fatal(err)
	}
	spin()
	if err := d.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	const nap = 30 * time.Millisecond
	time.Sleep(nap)
	if err := d.Read(ctx, out, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	spin()
	prof, err := d.StopProfile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("profile %+v", prof)
	var reads int
	for _, k := range prof.Kernels {
		if k.Kernel == "read back" {
			reads += k.Count
		}
	}
	if reads != 1 || prof.Copies <= 0 || prof.Dispatches != 2 || prof.Submits != 2 {
		t.Fatalf("%d read-backs timed (copies %v), %d dispatches in %d submits; want 1 (> 0), 2 in 2", reads, prof.Copies, prof.Dispatches, prof.Submits)
	}
	if prof.IdleBefore["read back"] < nap || prof.IdleBetween["dispatch > read back"] != prof.IdleBefore["read back"] {
		t.Fatalf("idle before the read-back %v (after a dispatch %v); the host slept %v before submitting it", prof.IdleBefore["read back"], prof.IdleBetween["dispatch > read back"], nap)
	}
	if prof.Idle > prof.Window || prof.Busy+prof.Copies+prof.Idle > prof.Window+prof.Window/100 {
		t.Fatalf("busy %v + copies %v + idle %v do not fit the window %v", prof.Busy, prof.Copies, prof.Idle, prof.Window)
	}
}

// TestSubmitProfile checks the profile of whole submissions: each batch
// is one "batch" entry (three dispatches in it, not timed apart), a batch
// submitted after the host slept shows that wait as idle before "batch",
// and the batches' times fit between the spin's own work and the window.
func TestSubmitProfile(t *testing.T) {
	d, p, out := profiledSpin(t)
	ctx := ctxT(t)
	spin := func() {
		b := d.Batch()
		for range 3 {
			if err := b.Dispatch(p, [3]uint32{4, 1, 1}, Params{}.U32(2000).U32(4), out); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Submit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.StartSubmitProfile(); err != nil {
		t.Fatal(err)
	}
	spin()
	if err := d.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	const nap = 30 * time.Millisecond
	time.Sleep(nap)
	spin()
	prof, err := d.StopProfile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("profile %+v", prof)
	if prof.Submits != 2 || prof.Dispatches != 2 || len(prof.Kernels) != 1 || prof.Kernels[0].Kernel != "batch" || prof.Kernels[0].Count != 2 {
		t.Fatalf("%d submits, %d timed, kernels %+v; want 2 batches timed whole", prof.Submits, prof.Dispatches, prof.Kernels)
	}
	if prof.IdleBefore["batch"] < nap || prof.IdleBetween["batch > batch"] != prof.IdleBefore["batch"] {
		t.Fatalf("idle before the second batch %v (after a batch %v); the host slept %v before submitting it", prof.IdleBefore["batch"], prof.IdleBetween["batch > batch"], nap)
	}
	if prof.Busy <= 0 || prof.Busy+prof.Idle > prof.Window+prof.Window/100 {
		t.Fatalf("busy %v + idle %v do not fit the window %v", prof.Busy, prof.Idle, prof.Window)
	}
	// A per-dispatch profile after it times dispatches again.
	if err := d.StartProfile(); err != nil {
		t.Fatal(err)
	}
	spin()
	if prof, err = d.StopProfile(ctx); err != nil || prof.Dispatches != 3 {
		t.Fatalf("per-dispatch profile after a submit profile: %+v, %v; want 3 dispatches", prof, err)
	}
}
