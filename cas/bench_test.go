package cas

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdrr/peer/cas/bao"
	zeebo "github.com/zeebo/blake3"
)

// BenchmarkStore measures, on the same bytes in one run: raw single-core
// BLAKE3 (zeebo/blake3, the limit), a plain write+fsync of the file (the
// disk's limit), `add` (hash + outboard + durable write + index), verified
// reads (read from disk, verify every group against the CID) and a served
// and received slice round trip (AppendSlice on one side, DecodeSlice on
// the other: two verifications). Ratios are of raw BLAKE3; add is also
// given as a ratio of the plain disk write, its other limit: on the
// Firecracker dev VM, writing new page-cache pages runs at 0.3-2.5 GB/s
// depending on whether the guest memory was touched before, below BLAKE3.
func BenchmarkStore(b *testing.B) {
	const size = 512 << 20
	dir := b.TempDir()
	path := filepath.Join(dir, "input")
	data := randData(1, size)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	rate := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e9 }
	best := func(f func() time.Duration) time.Duration {
		d := f()
		for range 2 {
			d = min(d, f())
		}
		return d
	}
	for b.Loop() {
		raw := best(func() time.Duration {
			t := time.Now()
			zeebo.Sum256(data)
			return time.Since(t)
		})
		disk := best(func() time.Duration {
			t := time.Now()
			f, _ := os.Create(filepath.Join(dir, "copy"))
			f.Write(data)
			f.Sync()
			f.Close()
			d := time.Since(t)
			os.Remove(filepath.Join(dir, "copy"))
			return d
		})
		var s *Store
		var c CID
		add := best(func() time.Duration {
			if s != nil {
				s.Close()
			}
			home, _ := os.MkdirTemp(dir, "home")
			var err error
			s, err = Open(home, Options{})
			if err != nil {
				b.Fatal(err)
			}
			t := time.Now()
			inf, err := s.AddFile(context.Background(), path, nil)
			if err != nil {
				b.Fatal(err)
			}
			c = inf.CID
			return time.Since(t)
		})
		fr, err := s.OpenFile(c)
		if err != nil {
			b.Fatal(err)
		}
		read := best(func() time.Duration {
			t := time.Now()
			fr.Seek(0, io.SeekStart)
			if _, err := fr.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
			return time.Since(t)
		})
		var scratch [bao.GroupSize]byte
		dst := make([]byte, 1<<20)
		var slice []byte
		roundTrip := best(func() time.Duration {
			t := time.Now()
			for _, sh := range fr.Shards() {
				for off := int64(0); off < sh.Size; off += 1 << 20 {
					n := min(1<<20, sh.Size-off)
					slice, err = s.AppendSlice(slice[:0], sh.CID, off, n)
					if err != nil {
						b.Fatal(err)
					}
					if err := bao.DecodeSlice(dst, slice, [32]byte(sh.CID), sh.Size, off, n, &scratch); err != nil {
						b.Fatal(err)
					}
				}
			}
			return time.Since(t)
		})
		s.Close()
		b.ReportMetric(rate(raw), "blake3-GB/s")
		b.ReportMetric(rate(disk), "disk-write-fsync-GB/s")
		b.ReportMetric(rate(add), "add-GB/s")
		b.ReportMetric(raw.Seconds()/add.Seconds(), "add-x-of-blake3")
		b.ReportMetric(disk.Seconds()/add.Seconds(), "add-x-of-disk")
		b.ReportMetric(rate(read), "verified-read-GB/s")
		b.ReportMetric(raw.Seconds()/read.Seconds(), "verified-read-x-of-blake3")
		b.ReportMetric(rate(roundTrip), "slice-serve+verify-GB/s")
		b.ReportMetric(raw.Seconds()/roundTrip.Seconds(), "slice-serve+verify-x-of-blake3")
	}
}
