package gpu

import "testing"

// A batch's dispatches are counted, and those wgpu places a barrier
// before (hazard.go): a read of a buffer last written in the batch, a
// write of a buffer used before in it; a buffer's first use in a batch
// waits for nothing, a barrier changes nothing for the buffers the
// dispatch does not bind, and a copy leaves its buffers as written.
func TestHazards(t *testing.T) {
	d := shared.d
	p, err := d.Compile(ctxT(t), Kernel{Name: "move", Bindings: []Access{ReadOnly, ReadWrite}, Source: `
@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read_write> b: array<u32>;
@compute @workgroup_size(1)
fn main() { b[0] = a[0] + 1u; }
`})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	bufs := map[string]*Buffer{}
	for _, n := range []string{"A", "B", "C", "D", "E", "F", "G", "H", "I"} {
		b, err := d.Alloc(256)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Release()
		bufs[n] = b
	}
	type step struct {
		read, write string // a dispatch; read "copy": a copy of write into H
		wait        bool
	}
	batch := func(steps []step) {
		t.Helper()
		before := d.Stats()
		b := d.Batch()
		want := 0
		for _, s := range steps {
			if s.read == "copy" {
				if err := b.Copy(bufs["H"], bufs[s.write]); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := b.Dispatch(p, [3]uint32{1, 1, 1}, nil, bufs[s.read], bufs[s.write]); err != nil {
				t.Fatal(err)
			}
			if s.wait {
				want++
			}
		}
		if err := b.Submit(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		after := d.Stats()
		dispatches := 0
		for _, s := range steps {
			if s.read != "copy" {
				dispatches++
			}
		}
		if n, w := after.Dispatches-before.Dispatches, after.Barriers-before.Barriers; n != uint64(dispatches) || w != uint64(want) {
			t.Fatalf("%v: %d dispatches, %d after a barrier; want %d, %d", steps, n, w, dispatches, want)
		}
	}
	batch([]step{
		{"A", "B", false}, // first uses
		{"A", "C", false}, // A read again
		{"B", "D", true},  // B written before
		{"A", "B", true},  // B read before
		{"C", "E", true},  // C written before the barriers since, which did not bind it
		{"C", "F", false}, // C read since
		{"copy", "G", false},
		{"G", "I", true}, // G copied from: waits
	})
	// A new batch: every buffer's first use again.
	batch([]step{{"B", "A", false}, {"D", "C", false}})
}
