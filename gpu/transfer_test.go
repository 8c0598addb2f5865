package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestUploadModes uploads awkward sizes into awkward offsets under every
// chunk schedule (whole staging buffers or a ramp from small chunks;
// submitted by the caller or by a submitter goroutine), from several
// goroutines at once, and reads every byte back.
func TestUploadModes(t *testing.T) {
	for _, mode := range []struct {
		ramp      uint64
		pipelined bool
	}{{0, false}, {0, true}, {4 << 10, false}, {4 << 10, true}, {12 << 10, true}} {
		t.Run(fmt.Sprintf("ramp%d-pipelined%v", mode.ramp, mode.pipelined), func(t *testing.T) {
			d := openDevice(t, Options{StagingBuffers: 3, StagingSize: 64 << 10, CopyWorkers: 3})
			if err := d.setUploadMode(mode.ramp, mode.pipelined); err != nil {
				t.Fatal(err)
			}
			r := rng(t)
			const workers = 3
			sizes := []int{1, 7, 4 << 10, 4<<10 + 3, 12 << 10, 64 << 10, 64<<10 + 5, 300<<10 + 1}
			var wg sync.WaitGroup
			errs := make(chan error, workers*len(sizes))
			for w := 0; w < workers; w++ {
				srcs := make([][]byte, len(sizes))
				for i, n := range sizes {
					srcs[i] = make([]byte, n)
					for j := range srcs[i] {
						srcs[i][j] = byte(r.Uint32())
					}
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i, src := range srcs {
						errs <- uploadAndCheck(d, src, uint64(4*(w+i)))
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			st := d.uploadStats()
			if st.Uploads != workers*int64(len(sizes)) {
				t.Errorf("stats count %d uploads; want %d", st.Uploads, workers*len(sizes))
			}
		})
	}
}

// uploadAndCheck uploads src at offset off of a fresh buffer whose other
// bytes are 0xee, and checks every byte of the buffer read back.
func uploadAndCheck(d *Device, src []byte, off uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	size := off + alignUp(uint64(len(src)), 4) + 8
	want := bytes.Repeat([]byte{0xee}, int(size))
	b, err := d.Alloc(size)
	if err != nil {
		return err
	}
	defer b.Release()
	if err := d.Write(b, want); err != nil {
		return err
	}
	copy(want[off:], src)
	clear(want[off+uint64(len(src)) : off+alignUp(uint64(len(src)), 4)]) // the zero padding
	if err := d.Upload(ctx, b.Sub(off, size-off), src); err != nil {
		return fmt.Errorf("upload of %d bytes at %d: %w", len(src), off, err)
	}
	got := make([]byte, size)
	if err := d.Read(ctx, b, got); err != nil {
		return err
	}
	if i := firstDiff(got, want); i >= 0 {
		return fmt.Errorf("upload of %d bytes at %d: byte %d reads %#x; want %#x", len(src), off, i, got[i], want[i])
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestUploadFailureKeepsRing uploads into a released buffer (every chunk's
// submission fails) and cancels an upload that waits for a staging
// buffer: both return their error, and afterwards every staging buffer is
// back in the ring and uploads work.
func TestUploadFailureKeepsRing(t *testing.T) {
	for _, pipelined := range []bool{false, true} {
		t.Run(fmt.Sprint("pipelined", pipelined), func(t *testing.T) {
			d := openDevice(t, Options{StagingBuffers: 2, StagingSize: 16 << 10, CopyWorkers: 2})
			if err := d.setUploadMode(4<<10, pipelined); err != nil {
				t.Fatal(err)
			}
			src := make([]byte, 200<<10)
			gone, err := d.Alloc(uint64(len(src)))
			if err != nil {
				t.Fatal(err)
			}
			gone.Release()
			if err := d.Upload(ctxT(t), gone, src); !errors.Is(err, ErrClosed) {
				t.Fatalf("upload into a released buffer: err = %v; want ErrClosed", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			live := upload(t, d, make([]byte, len(src)))
			if err := d.Upload(ctx, live, src); err != nil && !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled upload: err = %v; want nil or context.Canceled", err)
			}
			if err := d.Sync(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			waitRingFull(t, d)
			for i := range src {
				src[i] = byte(i*13 + 1)
			}
			if err := uploadAndCheck(d, src, 8); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// waitRingFull waits until every staging buffer is back in the ring (their
// map callbacks run on the poller, after the queue is idle).
func waitRingFull(t *testing.T, d *Device) {
	t.Helper()
	d.mu.Lock()
	st := d.stager
	d.mu.Unlock()
	for i := 0; len(st.free) != cap(st.free); i++ {
		if i == 1000 {
			t.Fatalf("%d of %d staging buffers came back to the ring", len(st.free), cap(st.free))
		}
		d.wake()
		time.Sleep(10 * time.Millisecond)
	}
}

// TestParallelCopy checks the split copy on sizes around its part bounds.
func TestParallelCopy(t *testing.T) {
	r := rng(t)
	for _, n := range []int{0, 1, copyPart - 1, copyPart, 2*copyPart + 63, 5*copyPart + 1, 3 << 20} {
		for _, w := range []int{1, 2, 3, 16} {
			src := make([]byte, n)
			for i := range src {
				src[i] = byte(r.Uint32())
			}
			dst := make([]byte, n+1)
			dst[n] = 0x5a
			parallelCopy(dst[:n], src, w)
			if !bytes.Equal(dst[:n], src) || dst[n] != 0x5a {
				t.Fatalf("parallelCopy(%d bytes, %d workers) differs", n, w)
			}
		}
	}
}

// TestUploadRampChunks checks the chunk schedule: an upload on an idle ring
// starts at the ramp and doubles up to the staging size; without a ramp it
// takes whole staging buffers.
func TestUploadRampChunks(t *testing.T) {
	d := openDevice(t, Options{StagingBuffers: 3, StagingSize: 64 << 10, CopyWorkers: 2})
	src := make([]byte, 300<<10+1)
	for i := range src {
		src[i] = byte(i * 7)
	}
	for _, c := range []struct {
		ramp   uint64
		chunks int64 // 4+8+16+32+64 KiB, then 64, 64 and the last 48 KiB + 1
	}{{4 << 10, 8}, {0, 5}} {
		if err := d.setUploadMode(c.ramp, true); err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		waitRingFull(t, d)
		before := d.uploadStats()
		if err := uploadAndCheck(d, src, 4); err != nil {
			t.Fatal(err)
		}
		if got := d.uploadStats().sub(before).Chunks; got != c.chunks {
			t.Errorf("ramp %d: %d chunks; want %d", c.ramp, got, c.chunks)
		}
	}
}
