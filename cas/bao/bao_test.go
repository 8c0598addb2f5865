package bao

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	zeebo "github.com/zeebo/blake3"
	refbao "lukechampine.com/blake3/bao"
)

// sizes that exercise the edges of groups, chunks and tree shapes.
var sizes = []int64{0, 1, 1023, 1024, 1025, GroupSize - 1, GroupSize, GroupSize + 1,
	2*GroupSize - 1, 2 * GroupSize, 3*GroupSize + 7, 5 * GroupSize, 7*GroupSize + 1,
	17 * GroupSize, 100*GroupSize + 333}

func randBytes(r *rand.Rand, n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestEncoderMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range sizes {
		data := randBytes(r, size)
		wantOB, wantRoot := refbao.EncodeBuf(data, GroupLog, true)
		if zeebo.Sum256(data) != wantRoot {
			t.Fatalf("size %d: reference bao root differs from BLAKE3", size)
		}
		// Feed in odd-sized writes to exercise buffering.
		var e Encoder
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+r.IntN(3*GroupSize))
			e.Write(rest[:n])
			rest = rest[n:]
		}
		root, ob := e.Sum(nil)
		if root != wantRoot {
			t.Errorf("size %d: root %x; want %x", size, root, wantRoot)
		}
		if !bytes.Equal(ob, wantOB) {
			t.Errorf("size %d: outboard differs from reference (len %d; want %d)", size, len(ob), len(wantOB))
		}
		if got := OutboardSize(size); got != int64(len(wantOB)) {
			t.Errorf("size %d: OutboardSize %d; want %d", size, got, len(wantOB))
		}
	}
}

func TestSlicesMatchReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var scratch [GroupSize]byte
	for _, size := range sizes {
		if size == 0 {
			continue
		}
		data := randBytes(r, size)
		var e Encoder
		e.Write(data)
		root, ob := e.Sum(nil)
		for range 20 {
			off := r.Int64N(size)
			n := 1 + r.Int64N(size-off)
			var want bytes.Buffer
			if err := refbao.ExtractSlice(&want, bytes.NewReader(data[off/GroupSize*GroupSize:]), bytes.NewReader(ob), GroupLog, uint64(off), uint64(n)); err != nil {
				t.Fatal(err)
			}
			start, end := Cover(size, off, n)
			if err := VerifyCover(root, ob, data[start:end], size, off, n, &scratch); err != nil {
				t.Fatalf("size %d [%d,+%d): VerifyCover: %v", size, off, n, err)
			}
			got, err := AppendSlice(nil, ob, data[start:end], size, off, n)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("size %d [%d,+%d): slice differs from reference", size, off, n)
			}
			// AppendSliceAt builds the same bytes, after what dst held,
			// reading data only inside the cover.
			at, err := AppendSliceAt([]byte("prefix"), ob, size, off, n, func(p []byte, o int64) error {
				if o < start || o+int64(len(p)) > end {
					t.Fatalf("size %d [%d,+%d): read [%d,+%d) outside the cover [%d,%d)", size, off, n, o, len(p), start, end)
				}
				copy(p, data[o:])
				return nil
			})
			if err != nil || !bytes.Equal(at, append([]byte("prefix"), got...)) {
				t.Fatalf("size %d [%d,+%d): AppendSliceAt differs from AppendSlice (%v)", size, off, n, err)
			}
			if SliceLen(size, off, n) != int64(len(got)) {
				t.Fatalf("size %d [%d,+%d): SliceLen %d; want %d", size, off, n, SliceLen(size, off, n), len(got))
			}
			dst := make([]byte, end-start)
			if err := DecodeSlice(dst, got, root, size, off, n, &scratch); err != nil {
				t.Fatalf("size %d [%d,+%d): DecodeSlice: %v", size, off, n, err)
			}
			if !bytes.Equal(dst, data[start:end]) {
				t.Fatalf("size %d [%d,+%d): decoded bytes differ", size, off, n)
			}
			var sink bytes.Buffer
			if ok, err := refbao.DecodeSlice(&sink, bytes.NewReader(got), GroupLog, uint64(off), uint64(n), root); !ok || err != nil {
				t.Fatalf("reference rejects our slice: %v %v", ok, err)
			}
		}
	}
}

// AppendSliceAt reads each run of consecutive groups with one call, and
// returns dst as it was when a read fails.
func TestAppendSliceAtRuns(t *testing.T) {
	size := int64(64 * GroupSize)
	data := randBytes(rand.New(rand.NewPCG(7, 8)), size)
	var e Encoder
	e.Write(data)
	_, ob := e.Sum(nil)
	for _, tc := range []struct {
		off, n int64
		reads  int // a subtree of 2^k aligned groups: a node between every pair
	}{
		{0, GroupSize, 1},
		{0, 2 * GroupSize, 1},
		{0, 16 * GroupSize, 8},
		{16 * GroupSize, 16 * GroupSize, 8},
		{GroupSize, 2 * GroupSize, 2},
	} {
		var reads int
		got, err := AppendSliceAt(nil, ob, size, tc.off, tc.n, func(p []byte, o int64) error {
			reads++
			copy(p, data[o:])
			return nil
		})
		start, end := Cover(size, tc.off, tc.n)
		want, _ := AppendSlice(nil, ob, data[start:end], size, tc.off, tc.n)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("[%d,+%d): slice differs (%v)", tc.off, tc.n, err)
		}
		if reads != tc.reads {
			t.Errorf("[%d,+%d): %d reads; want %d", tc.off, tc.n, reads, tc.reads)
		}
	}
	boom := errors.New("boom")
	dst := []byte("kept")
	got, err := AppendSliceAt(dst, ob, size, 0, 16*GroupSize, func(p []byte, o int64) error {
		if o > 0 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) || string(got) != "kept" {
		t.Fatalf("failed read: %q, %v; want %q, %v", got, err, "kept", boom)
	}
}

// Every single flipped byte of a slice is caught and pinned to a range that
// contains the flipped data byte.
func TestDecodeSliceCatchesEveryFlip(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var scratch [GroupSize]byte
	size := int64(5*GroupSize + 100)
	data := randBytes(r, size)
	var e Encoder
	e.Write(data)
	root, ob := e.Sum(nil)
	off, n := int64(GroupSize+5), int64(3*GroupSize)
	start, end := Cover(size, off, n)
	slice, _ := AppendSlice(nil, ob, data[start:end], size, off, n)
	dst := make([]byte, end-start)
	// -short (the race pass of make test, where this loop took 40-90 s)
	// flips every byte of the slice's first 4 KiB and every 61st after it
	// (so at least one of every 64-byte node between the groups); the
	// full pass flips them all.
	step, head := 1, len(slice)
	if testing.Short() {
		step, head = 61, 4096
	}
	for i := range slice {
		if i >= head && i%step != 0 {
			continue
		}
		bad := bytes.Clone(slice)
		bad[i] ^= 1 << (i % 8)
		err := DecodeSlice(dst, bad, root, size, off, n, &scratch)
		var be *Error
		if !errors.As(err, &be) {
			t.Fatalf("flip at %d: err %v; want *Error", i, err)
		}
	}
}

// Decoding slices that together cover every group assembles the outboard.
func TestDecodeSliceAssemblesOutboard(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	var scratch [GroupSize]byte
	for _, size := range sizes {
		data := randBytes(r, size)
		var e Encoder
		e.Write(data)
		root, want := e.Sum(nil)
		ob := make([]byte, OutboardSize(size))
		step := int64(1+r.IntN(5)) * GroupSize
		for off := int64(0); off < size; off += step {
			n := min(step, size-off)
			slice, _ := AppendSlice(nil, want, data[off:off+n], size, off, n)
			if err := DecodeSlice(make([]byte, n), slice, root, size, off, n, &scratch); err != nil {
				t.Fatal(err)
			}
			CopySliceNodes(ob, slice, size, off, n)
		}
		if size > 0 && !bytes.Equal(ob, want) {
			t.Fatalf("size %d: assembled outboard differs", size)
		}
		if err := VerifyTree(root, want, size); err != nil {
			t.Fatalf("size %d: VerifyTree: %v", size, err)
		}
		if len(want) > HeaderSize {
			want[HeaderSize+r.IntN(len(want)-HeaderSize)] ^= 4
			if err := VerifyTree(root, want, size); err == nil {
				t.Fatalf("size %d: VerifyTree accepts a flipped node", size)
			}
		}
	}
}

func TestVerifyCoverNamesFlippedGroup(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var scratch [GroupSize]byte
	size := int64(9*GroupSize + 1)
	data := randBytes(r, size)
	var e Encoder
	e.Write(data)
	root, ob := e.Sum(nil)
	for g := int64(0); g < Groups(size); g++ {
		bad := bytes.Clone(data)
		bad[g*GroupSize] ^= 0x80
		err := VerifyCover(root, ob, bad, size, 0, size, &scratch)
		var be *Error
		if !errors.As(err, &be) || be.Off != g*GroupSize {
			t.Fatalf("flip in group %d: err %v; want *Error at %d", g, err, g*GroupSize)
		}
		// A range that does not cover the flipped group still verifies.
		if g > 0 {
			if err := VerifyCover(root, ob, bad[:GroupSize], size, 0, GroupSize, &scratch); err != nil {
				t.Fatalf("flip in group %d fails an unrelated range: %v", g, err)
			}
		}
	}
}

// medianRatio returns the median over runs of ref[i]/ours[i]: how many
// times faster ours ran than the reference, run for run.
func medianRatio(ours, ref []time.Duration) float64 {
	r := make([]float64, len(ours))
	for i := range ours {
		r[i] = float64(ref[i]) / float64(ours[i])
	}
	slices.Sort(r)
	if len(r)%2 == 1 {
		return r[len(r)/2]
	}
	return (r[len(r)/2-1] + r[len(r)/2]) / 2
}

// The reason this package exists is speed, so its benchmarks measure the
// reference (lukechampine.com/blake3/bao) on the same input in the same
// run, right after each of ours, and report how many times faster ours is
// (the median over iterations of reference time / our time) as
// x-of-lukechampine. ns/op and MB/s are ours alone.

// BenchmarkDecodeSlice verifies and decodes the slice of a range of a
// 64 MiB blob, as a fetcher does with every piece: one group, and the
// 1 MiB pieces swarm requests.
func BenchmarkDecodeSlice(b *testing.B) {
	size := int64(64 << 20)
	data := randBytes(rand.New(rand.NewPCG(1, 1)), size)
	var e Encoder
	e.Write(data)
	root, ob := e.Sum(nil)
	for _, n := range []int64{GroupSize, 1 << 20} {
		b.Run(fmt.Sprintf("%dKiB", n>>10), func(b *testing.B) {
			var scratch [GroupSize]byte
			off := int64(17 << 20)
			slice, _ := AppendSlice(nil, ob, data[off:off+n], size, off, n)
			dst := make([]byte, n)
			var sink bytes.Buffer
			var ours, ref []time.Duration
			b.SetBytes(n)
			for b.Loop() {
				t := time.Now()
				if err := DecodeSlice(dst, slice, root, size, off, n, &scratch); err != nil {
					b.Fatal(err)
				}
				ours = append(ours, time.Since(t))
				b.StopTimer()
				sink.Reset()
				t = time.Now()
				if ok, err := refbao.DecodeSlice(&sink, bytes.NewReader(slice), GroupLog, uint64(off), uint64(n), root); !ok || err != nil {
					b.Fatalf("reference: %v %v", ok, err)
				}
				ref = append(ref, time.Since(t))
				b.StartTimer()
			}
			b.ReportMetric(medianRatio(ours, ref), "x-of-lukechampine")
		})
	}
}

// BenchmarkEncoder computes the root and outboard of 64 MiB, as add does.
func BenchmarkEncoder(b *testing.B) {
	data := randBytes(rand.New(rand.NewPCG(1, 1)), 64<<20)
	var e Encoder
	var ob []byte
	var ours, ref []time.Duration
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		t := time.Now()
		e.Reset()
		e.Write(data)
		_, ob = e.Sum(ob[:0])
		ours = append(ours, time.Since(t))
		b.StopTimer()
		t = time.Now()
		refbao.EncodeBuf(data, GroupLog, true)
		ref = append(ref, time.Since(t))
		b.StartTimer()
	}
	b.ReportMetric(medianRatio(ours, ref), "x-of-lukechampine")
}

func BenchmarkZeebo(b *testing.B) {
	data := randBytes(rand.New(rand.NewPCG(1, 1)), 64<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		zeebo.Sum256(data)
	}
}
