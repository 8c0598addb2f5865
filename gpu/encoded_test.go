package gpu

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"
)

// TestEncodedAhead checks batches encoded ahead and submitted later: they
// run in the order submitted, not encoded; a read started before them sees
// the data as it was; the bind groups they set survive the cache being
// cleared before their submit (a small cache, each dispatch a new group);
// a buffer released in between fails the whole submission with an error,
// not a crash, and runs none of it; a dropped batch holds nothing.
func TestEncodedAhead(t *testing.T) {
	d, k := smallBindGroupCache(t)
	ctx := ctxT(t)
	const n, dim = 12, 64
	alloc := func() *Buffer {
		b, err := d.Alloc(n * dim * 4)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Release)
		return b
	}
	src, dst, w := alloc(), alloc(), alloc()
	vals := make([]float32, n*dim)
	for i := range vals {
		vals[i] = float32(i%7) + 1
	}
	d.Write(src, Bytes(vals))
	d.Write(w, Bytes([]float32{2, 3, 0, 0}))
	d.Write(dst, make([]byte, n*dim*4))
	read := func(b *Buffer) []float32 {
		t.Helper()
		got := make([]byte, n*dim*4)
		if err := d.Read(ctx, b, got); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, n*dim)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(got[4*i:]))
		}
		return out
	}
	// accumulate records dst += scale*src over every range, each range a
	// new bind group (the cache of 4 clears during the encode).
	accumulate := func(dst *Buffer, scale int) *Batch {
		b := d.Batch()
		for i := 0; i < n; i++ {
			sub := func(buf *Buffer) Span { return buf.Sub(uint64(i*dim*4), dim*4) }
			k.Accumulate(ctx, b, sub(src), w, sub(dst), 1, dim, scale)
		}
		return b
	}
	// Encode "+2 src" then "y = copy of dst"; submit them the other way
	// round: the copy runs first and sees zeros.
	first, err := accumulate(dst, 0).Encode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	y := alloc()
	cb := d.Batch()
	cb.Copy(y, dst)
	copied, err := cb.Encode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// More encoding in between clears the bind group cache again, after
	// first's groups were handed to its command buffer.
	third, err := accumulate(dst, 1).Encode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pending, err := d.StartRead(dst, n*dim*4)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SubmitEncoded(ctx, copied, first, third); err != nil {
		t.Fatal(err)
	}
	before := make([]byte, n*dim*4)
	if err := pending.Wait(ctx, before); err != nil {
		t.Fatal(err)
	}
	for i, b := range before {
		if b != 0 {
			t.Fatalf("a read started before the submit saw byte %d = %d; want the zeros of then", i, b)
		}
	}
	for i, v := range read(y) {
		if v != 0 {
			t.Fatalf("the copy submitted first saw element %d = %g; want 0", i, v)
		}
	}
	got := read(dst)
	for i, v := range got {
		if want := 5 * vals[i]; v != want {
			t.Fatalf("element %d = %g; want %g (2 and 3 times src)", i, v, want)
		}
	}
	if err := d.SubmitEncoded(ctx, first); !errors.Is(err, ErrClosed) {
		t.Fatalf("submitting again: err = %v; want ErrClosed", err)
	}

	// A buffer released between Encode and submit: nothing of the
	// submission runs, the error names the kernel.
	ok, err := accumulate(dst, 0).Encode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	z := alloc()
	bad, err := accumulate(z, 0).Encode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	z.Release()
	if err := d.SubmitEncoded(ctx, ok, bad); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "accumulate") {
		t.Fatalf("released buffer: err = %v; want ErrClosed naming accumulate", err)
	}
	for i, v := range read(dst) {
		if v != got[i] {
			t.Fatalf("element %d = %g after a refused submission; want %g unchanged", i, v, got[i])
		}
	}
	if err := d.SubmitEncoded(ctx, ok); !errors.Is(err, ErrClosed) {
		t.Fatalf("a batch of a refused submission: err = %v; want ErrClosed (dropped)", err)
	}

	// Drop hands back the params arena: the wgpu buffers not in the pool
	// are as many as before the encode.
	d.Sync(ctx)
	s0 := d.Stats()
	dropped, err := accumulate(dst, 0).Encode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := d.Stats(); s.NativeBuffers-s.PooledBuffers <= s0.NativeBuffers-s0.PooledBuffers {
		t.Fatalf("an encoded batch holds no params buffer (%+v, before %+v)", s, s0)
	}
	dropped.Drop()
	dropped.Drop()
	if s := d.Stats(); s.NativeBuffers-s.PooledBuffers != s0.NativeBuffers-s0.PooledBuffers {
		t.Fatalf("after Drop: %d buffers out of the pool; want %d", s.NativeBuffers-s.PooledBuffers, s0.NativeBuffers-s0.PooledBuffers)
	}
}

// TestSubmitRead checks a read submitted with its batch: it sees what the
// batch's dispatches wrote (not the data before them), a length that is
// not a multiple of 4 and an offset into a buffer, nothing for 0 bytes;
// a read past the buffer or of a batch already submitted fails without
// submitting, and a released source fails the submit.
func TestSubmitRead(t *testing.T) {
	d, k := smallBindGroupCache(t)
	ctx := ctxT(t)
	const dim = 64
	vals := make([]float32, 2*dim)
	for i := range vals {
		vals[i] = float32(i) + 0.5
	}
	src, w := upload(t, d, Bytes(vals)), upload(t, d, Bytes([]float32{3, 0, 0, 0}))
	dst := upload(t, d, make([]byte, 2*dim*4))
	b := d.Batch()
	k.Accumulate(ctx, b, src, w, dst, 1, 2*dim, 0) // dst += 3 src (dst was zeros)
	s0 := d.Stats()
	r, err := b.SubmitRead(ctx, dst.Sub(dim*4, dim*4), dim*4-2)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, dim*4-2)
	if err := r.Wait(ctx, got); err != nil {
		t.Fatal(err)
	}
	three := make([]float32, dim)
	for i := range three {
		three[i] = 3 * vals[dim+i]
	}
	if want := Bytes(three)[:len(got)]; string(got) != string(want) {
		t.Fatalf("read back % x...; want % x... (3 times the source: the batch's work)", got[:8], want[:8])
	}
	if err := b.Submit(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("the batch submitted again: %v; want ErrClosed", err)
	}
	if _, err := b.SubmitRead(ctx, dst, 4); !errors.Is(err, ErrClosed) {
		t.Errorf("a read of a batch already submitted: %v; want ErrClosed", err)
	}
	// Nothing to read: the batch still runs.
	b = d.Batch()
	k.Accumulate(ctx, b, src, w, dst, 1, 2*dim, 0)
	if r, err = b.SubmitRead(ctx, dst, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Wait(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	all := make([]byte, 2*dim*4)
	if err := d.Read(ctx, dst, all); err != nil {
		t.Fatal(err)
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(all)); v != 6*vals[0] {
		t.Fatalf("after a batch with a read of nothing, element 0 = %g; want %g", v, 6*vals[0])
	}
	// A read past the buffer: refused, the batch not run.
	b = d.Batch()
	k.Accumulate(ctx, b, src, w, dst, 1, 2*dim, 0)
	if _, err := b.SubmitRead(ctx, dst, 2*dim*4+4); !errors.Is(err, ErrShape) {
		t.Errorf("a read past the buffer: %v; want ErrShape", err)
	}
	if err := d.Read(ctx, dst, all); err != nil {
		t.Fatal(err)
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(all)); v != 6*vals[0] {
		t.Fatalf("a refused read's batch ran: element 0 = %g; want %g", v, 6*vals[0])
	}
	// A source released before the submit.
	gone, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	b = d.Batch()
	k.Accumulate(ctx, b, src, w, dst, 1, 2*dim, 0)
	gone.Release()
	if _, err := b.SubmitRead(ctx, gone, 64); err == nil {
		t.Error("a read of a released buffer submitted")
	}
	// What the reads took went back to the pool (the read-back buffers
	// of the refused reads included).
	if s := d.Stats(); s.NativeBuffers-s.PooledBuffers != s0.NativeBuffers-s0.PooledBuffers {
		t.Errorf("after the reads: %d buffers out of the pool; want %d", s.NativeBuffers-s.PooledBuffers, s0.NativeBuffers-s0.PooledBuffers)
	}
	// A closed device: an error, not a crash.
	b = d.Batch()
	k.Accumulate(ctx, b, src, w, dst, 1, 2*dim, 0)
	d.Close()
	if _, err := b.SubmitRead(ctx, dst, 4); !errors.Is(err, ErrClosed) {
		t.Errorf("a read on a closed device: %v; want ErrClosed", err)
	}
}
