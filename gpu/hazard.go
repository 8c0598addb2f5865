package gpu

// What a batch's dispatches wait for. wgpu tracks each buffer's use
// through a command buffer and places a pipeline barrier before a
// dispatch that reads a buffer whose last use was a write, or writes a
// buffer used before in it (read or written: by buffer, not by range); a
// buffer's first use needs none inside it (its transition is resolved
// before the command buffer runs). A Vulkan barrier waits for all the
// work recorded before it, not only for that buffer's writer, so a
// dispatch with no barrier before it runs beside the ones before it, and
// one with a barrier starts a new stage. On an H200 a decode step whose
// FFN norm ran beside its router took 4.2-4.5% less than one with a
// barrier forced between them (experts/BENCHMARKS.md, 2026-11-29).
//
// This is a model of wgpu's placement, kept by the buffers' hazard
// fields while a batch encodes; copies and clears, which end a compute
// pass and change a buffer's usage, leave their buffers as written (any
// later use waits).

// hazard is a buffer's use so far in the batch being encoded: valid when
// epoch is the device's hazardEpoch.
type hazard struct {
	epoch   uint64
	written bool
}

// hazards counts cmds' dispatches and those with a barrier before them,
// into d's counters. Called with d.mu held, once a batch.
func (d *Device) hazards(cmds []command) {
	d.hazardEpoch++
	ep := d.hazardEpoch
	used := func(b *Buffer) (inUse, written bool) {
		h := &b.hazard
		return h.epoch == ep, h.epoch == ep && h.written
	}
	for _, c := range cmds {
		if c.pipe == nil {
			for _, s := range []Span{c.src, c.dst} {
				if s.buf != nil {
					s.buf.hazard = hazard{epoch: ep, written: true}
				}
			}
			continue
		}
		d.counters.dispatches++
		access := c.pipe.e.bindings
		wait := false
		for i, s := range c.spans {
			inUse, written := used(s.buf)
			if access[i] == ReadWrite && inUse || access[i] == ReadOnly && written {
				wait = true
			}
		}
		if wait {
			d.counters.barriers++
		}
		for i, s := range c.spans {
			s.buf.hazard = hazard{epoch: ep, written: access[i] == ReadWrite}
		}
	}
}
