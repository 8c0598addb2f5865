package tiers

import (
	"bytes"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"golang.org/x/sys/unix"
)

// BenchmarkDiskToRAM promotes 64 MiB keys from the disk level (verified
// reads of the cas store, spread over cores) and reports the rate as a
// ratio of a raw sequential read of a file holding the same bytes,
// measured in the same run: warm page cache, and cold (each file's pages
// dropped before each read).
func BenchmarkDiskToRAM(b *testing.B) {
	const size = 256 << 20
	dir := b.TempDir()
	st, err := cas.Open(filepath.Join(dir, "store"), cas.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(data[i:], r.Uint64())
	}
	info, err := st.Put(context.Background(), bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	raw := filepath.Join(dir, "raw")
	os.WriteFile(raw, data, 0o644)
	blobPath := findBlob(b, filepath.Join(dir, "store"), size)
	src := DiskSource{st}
	const keyLen = 64 << 20
	buf := make([]byte, keyLen)
	readRaw := func() {
		f, _ := os.Open(raw)
		for off := int64(0); off < size; off += keyLen {
			f.ReadAt(buf, off)
		}
		f.Close()
	}
	readTiers := func() {
		for off := int64(0); off < size; off += keyLen {
			if err := src.Read(context.Background(), Key{Blob: info.CID, Size: size, Off: off, Len: keyLen}, buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	timeIt := func(f func()) float64 { t0 := time.Now(); f(); return time.Since(t0).Seconds() }
	var warmRaw, warmTiers, coldRaw, coldTiers float64
	for i := 0; i < b.N; i++ {
		readRaw()
		readTiers()
		warmRaw += timeIt(readRaw)
		warmTiers += timeIt(readTiers)
		drop(raw)
		coldRaw += timeIt(readRaw)
		drop(blobPath)
		coldTiers += timeIt(readTiers)
	}
	n := float64(b.N) * size
	b.ReportMetric(n/warmTiers/1e9, "warm-GB/s")
	b.ReportMetric(warmRaw/warmTiers, "x-raw-warm")
	b.ReportMetric(n/coldTiers/1e9, "cold-GB/s")
	b.ReportMetric(coldRaw/coldTiers, "x-raw-cold")
}

// findBlob returns the store's file of the one blob of size bytes.
func findBlob(b *testing.B, dir string, size int64) string {
	var found string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Size() == size {
			found = p
		}
		return nil
	})
	if found == "" {
		b.Fatal("blob file not found")
	}
	return found
}

func drop(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	f.Sync()
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
