package gpu

import (
	"context"
	"testing"

	"github.com/cogentcore/webgpu/wgpu"
)

// BenchmarkEncode measures the host's cost of recording and encoding a
// batch of 20 small dispatches (accumulates over ranges of one buffer,
// their bind groups cached): what a paged decode step pays for each
// layer it encodes ahead. The limit, measured in the same run: the same
// 20 dispatches encoded with wgpu directly (the params written, one pass,
// bind groups made beforehand), which is what any WebGPU program pays;
// reported as x-of-wgpu (1: no overhead of ours) on the wgpu row.
func BenchmarkEncode(b *testing.B) {
	d, k := shared.d, shared.k
	ctx := context.Background()
	const n, dim = 20, 4096
	alloc := func() *Buffer {
		buf, err := d.Alloc(n * dim * 4)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(buf.Release)
		return buf
	}
	src, dst, w := alloc(), alloc(), alloc()
	record := func() *Batch {
		bt := d.Batch()
		for i := range n {
			sub := func(buf *Buffer) Span { return buf.Sub(uint64(i*dim*4), dim*4) }
			k.Accumulate(ctx, bt, sub(src), w, sub(dst), 1, dim, 1)
		}
		return bt
	}
	var ours float64
	b.Run("gpu", func(b *testing.B) {
		for b.Loop() {
			e, err := record().Encode(ctx)
			if err != nil {
				b.Fatal(err)
			}
			e.Drop()
		}
		ours = float64(b.Elapsed().Nanoseconds()) / float64(b.N*n)
		b.ReportMetric(ours, "ns/dispatch")
	})
	b.Run("wgpu", func(b *testing.B) {
		// The same commands' pipeline, bind groups and params, made once.
		bt := record()
		defer bt.Drop()
		d.mu.Lock()
		c0 := bt.cmds[0]
		e := c0.pipe.e
		arena, err := d.allocLocked(usageUniform, uint64(len(bt.params)))
		if err != nil {
			d.mu.Unlock()
			b.Fatal(err)
		}
		bg1, err := d.bindGroupLocked(e.layout, e.layout.group1, []Span{{arena, 0, alignUp(uint64(e.params), 16)}})
		if err != nil {
			d.mu.Unlock()
			b.Fatal(err)
		}
		bgs := make([]*wgpu.BindGroup, len(bt.cmds))
		for i, c := range bt.cmds {
			if bgs[i], err = d.bindGroupLocked(e.layout, e.layout.group0, c.spans); err != nil {
				d.mu.Unlock()
				b.Fatal(err)
			}
		}
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			d.releaseLocked(arena)
			d.mu.Unlock()
		}()
		for b.Loop() {
			if err := rawEncode(d, arena, bt, bgs, bg1); err != nil {
				b.Fatal(err)
			}
		}
		raw := float64(b.Elapsed().Nanoseconds()) / float64(b.N*n)
		b.ReportMetric(raw, "ns/dispatch")
		if ours > 0 { // -bench left "gpu" out otherwise
			b.ReportMetric(ours/raw, "x-of-wgpu")
		}
	})
}

// rawEncode encodes bt's dispatches with wgpu's own calls: the params
// written into arena, one compute pass, the bind groups given.
func rawEncode(d *Device, arena *Buffer, bt *Batch, bgs []*wgpu.BindGroup, bg1 *wgpu.BindGroup) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.queue.WriteBuffer(arena.raw, 0, bt.params); err != nil {
		return err
	}
	enc, err := d.dev.CreateCommandEncoder(nil)
	if err != nil {
		return err
	}
	defer enc.Release()
	pass := enc.BeginComputePass(nil)
	for i, c := range bt.cmds {
		pass.SetPipeline(c.pipe.e.pipe)
		pass.SetBindGroup(0, bgs[i], nil)
		pass.SetBindGroup(1, bg1, []uint32{c.paramOff})
		pass.DispatchWorkgroups(c.groups[0], c.groups[1], c.groups[2])
	}
	err = pass.End()
	pass.Release()
	if err != nil {
		return err
	}
	cb, err := enc.Finish(nil)
	if err != nil {
		return err
	}
	cb.Release()
	return nil
}
