package cas

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rdrr/peer/cas/bao"
	zeebo "github.com/zeebo/blake3"
)

// BenchmarkStore measures, on the same bytes in one run: raw single-core
// BLAKE3 (zeebo/blake3, the limit), a plain write+fsync of the file (the
// disk's limit), `add` (hash + outboard + durable write + index), verified
// reads warm (the blob just written, from the page cache) and cold (blob
// files and outboards evicted with posix_fadvise DONTNEED and the outboard
// cache emptied before each run) next to a plain cold read of the same
// files (the disk's read limit), and a served and received slice round
// trip (AppendSlice on one side, DecodeSlice on the other: two
// verifications). Each is the median of RDRR_CAS_BENCH_RUNS runs (default
// 5) on RDRR_CAS_BENCH_MIB MiB (default 512). Ratios are of raw BLAKE3;
// add is also given as a ratio of the plain disk write, the cold read of
// the plain cold read. On the Firecracker dev VM, writing new page-cache
// pages runs at 0.3-2.5 GB/s depending on whether the guest memory was
// touched before, below BLAKE3.
func BenchmarkStore(b *testing.B) {
	size := int64(envInt("RDRR_CAS_BENCH_MIB", 512)) << 20
	runs := envInt("RDRR_CAS_BENCH_RUNS", 5)
	dir := b.TempDir()
	path := filepath.Join(dir, "input")
	data := randData(1, size)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	rate := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e9 }
	median := func(f func() time.Duration) time.Duration {
		ds := make([]time.Duration, runs)
		for i := range ds {
			ds[i] = f()
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	for b.Loop() {
		raw := median(func() time.Duration {
			t := time.Now()
			zeebo.Sum256(data)
			return time.Since(t)
		})
		disk := median(func() time.Duration {
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
		add := median(func() time.Duration {
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
		read := func() time.Duration {
			t := time.Now()
			fr.Seek(0, io.SeekStart)
			if _, err := fr.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
			return time.Since(t)
		}
		warm := median(read)
		// Every file a cold read touches: the blobs and their outboards.
		var files []string
		for _, sh := range append(fr.Shards(), Shard{CID: c.Raw()}) {
			files = append(files, s.blobPath(sh.CID), s.outboardPath(sh.CID))
		}
		evict := func() bool {
			s.obCache.Purge()
			for _, f := range files {
				if err := dropCache(f); err != nil {
					b.Logf("cold reads not measured: %v", err)
					return false
				}
			}
			return true
		}
		var cold, plainCold time.Duration
		if evict() {
			cold = median(func() time.Duration {
				evict()
				return read()
			})
			buf := make([]byte, 1<<20)
			plainCold = median(func() time.Duration {
				evict()
				t := time.Now()
				for _, sh := range fr.Shards() {
					f, err := os.Open(s.blobPath(sh.CID))
					if err != nil {
						b.Fatal(err)
					}
					io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
					f.Close()
				}
				return time.Since(t)
			})
		}
		var scratch [bao.GroupSize]byte
		dst := make([]byte, 1<<20)
		var slice []byte
		roundTrip := median(func() time.Duration {
			t := time.Now()
			for _, sh := range fr.Shards() {
				for off := int64(0); off < sh.Size; off += 1 << 20 {
					n := min(1<<20, sh.Size-off)
					slice, err = s.AppendSlice(slice[:0], sh.CID, off, n)
					if err != nil {
						b.Fatal(err)
					}
					if err := bao.DecodeSlice(dst, slice, sh.CID.Digest(), sh.Size, off, n, &scratch); err != nil {
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
		b.ReportMetric(rate(warm), "verified-read-warm-GB/s")
		b.ReportMetric(raw.Seconds()/warm.Seconds(), "verified-read-warm-x-of-blake3")
		if cold > 0 {
			b.ReportMetric(rate(plainCold), "plain-read-cold-GB/s")
			b.ReportMetric(rate(cold), "verified-read-cold-GB/s")
			b.ReportMetric(plainCold.Seconds()/cold.Seconds(), "verified-read-cold-x-of-plain-read-cold")
		}
		b.ReportMetric(rate(roundTrip), "slice-serve+verify-GB/s")
		b.ReportMetric(raw.Seconds()/roundTrip.Seconds(), "slice-serve+verify-x-of-blake3")
	}
}

// envInt returns the integer in the environment variable name, or def.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
