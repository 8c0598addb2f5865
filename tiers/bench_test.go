package tiers

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
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

// BenchmarkRAMToVRAM promotes keys from the RAM level to VRAM through the
// cache (Get at VRAM of keys RAM holds, into an arena half their number, so
// every Get evicts and uploads) and reports the rate as a ratio of plain
// gpu.Device.Upload calls of the same bytes into the same slots, measured
// in the same run (x-of-upload), and of PCIe 5 x16 (64 GB/s). Sequential
// is one Get at a time (then Sync); parallel is four goroutines, as a
// demand and the prefetch workers run; one is a Get at a time, each
// waited for on the GPU (against an Upload+Sync at a time).
func BenchmarkRAMToVRAM(b *testing.B) {
	if os.Getenv("XDG_RUNTIME_DIR") == "" {
		b.Setenv("XDG_RUNTIME_DIR", b.TempDir())
	}
	var o gpu.Options
	if s := os.Getenv("RDRR_GPU_BACKEND"); s != "" {
		o.Backend, _ = gpu.ParseBackend(s)
	}
	ctx := context.Background()
	d, err := gpu.Open(ctx, o)
	if err != nil {
		b.Skipf("no GPU adapter: %v", err)
	}
	defer d.Close()
	keyLen, nkeys := int64(64<<20), 16
	if d.Info().Type == "cpu" {
		keyLen, nkeys = 8<<20, 8
	}
	data := make([]byte, keyLen*int64(nkeys))
	r := rand.New(rand.NewPCG(5, 6))
	for i := 0; i+8 <= len(data); i += 8 {
		binary.LittleEndian.PutUint64(data[i:], r.Uint64())
	}
	blob := cas.Sum(data[:1024]) // a name only: memSource does not verify
	keys := make([]Key, nkeys)
	for i := range keys {
		keys[i] = Key{Blob: blob, Size: int64(len(data)), Off: int64(i) * keyLen, Len: keyLen}
	}
	arena, err := NewGPUArena(d, keyLen, nkeys/2, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer arena.Release()
	drain := func() {
		if err := d.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// timed runs get over every key from workers goroutines and returns
	// bytes per second; one runs them one at a time, each waited for (a
	// lone upload: call to data on the GPU).
	timed := func(workers int, get func(i int)) float64 {
		drain()
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < nkeys; i += workers {
					get(i)
				}
			}()
		}
		wg.Wait()
		drain()
		return float64(nkeys) * float64(keyLen) / time.Since(start).Seconds()
	}
	one := func(get func(i int)) float64 {
		drain()
		var total time.Duration
		for i := 0; i < nkeys; i++ {
			t0 := time.Now()
			get(i)
			drain()
			total += time.Since(t0)
		}
		return float64(nkeys) * float64(keyLen) / total.Seconds()
	}
	raw := func(i int) {
		k := keys[i]
		if err := arena.Upload(ctx, i%arena.Slots(), data[k.Off:k.Off+k.Len]); err != nil {
			b.Error(err)
		}
	}
	// ram=heap keeps the RAM level in Go memory (an upload is a memcpy into
	// staging and a copy); ram=host in the arena's host memory
	// (Config.HostRAM: one copy, no memcpy).
	for _, host := range []bool{false, true} {
		name := "ram=heap"
		if host {
			name = "ram=host"
		}
		b.Run(name, func(b *testing.B) {
			c, err := New(Config{RAM: int64(len(data)), Arena: arena, Disk: memSource(data), Policy: "lru", HostRAM: host})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			c.ForVRAM(keys)
			for _, k := range keys {
				l, err := c.Get(ctx, k, RAM)
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
			if hb := d.Stats().HostBuffers; host != (hb == nkeys) {
				b.Fatalf("%d host buffers for %d keys in RAM (HostRAM %v)", hb, nkeys, host)
			}
			promote := func(i int) {
				l, err := c.Get(ctx, keys[i], VRAM)
				if err != nil {
					b.Error(err)
					return
				}
				l.Release()
			}
			timed(1, promote) // warm: the staging ring, the arena's pages
			var seqCache, seqRaw, parCache, parRaw, oneCache, oneRaw float64
			for i := 0; i < b.N; i++ {
				seqRaw += timed(1, raw)
				seqCache += timed(1, promote)
				parRaw += timed(4, raw)
				parCache += timed(4, promote)
				oneRaw += one(raw)
				oneCache += one(promote)
			}
			n := float64(b.N)
			b.ReportMetric(seqCache/n/1e9, "GB/s")
			b.ReportMetric(seqCache/seqRaw, "x-of-upload")
			b.ReportMetric(seqCache/n/pcie5x16, "x-of-pcie5x16")
			b.ReportMetric(parCache/n/1e9, "parallel-GB/s")
			b.ReportMetric(parCache/parRaw, "parallel-x-of-upload")
			b.ReportMetric(parCache/n/pcie5x16, "parallel-x-of-pcie5x16")
			b.ReportMetric(oneCache/n/1e9, "one-GB/s")
			b.ReportMetric(oneCache/oneRaw, "one-x-of-upload")
			b.ReportMetric(oneCache/n/pcie5x16, "one-x-of-pcie5x16")
		})
	}
}

// pcie5x16 is the data-sheet limit of a PCIe 5 x16 link, 64 GB/s each way
// (the H100's host link).
const pcie5x16 = 64e9

// memSource is a source in memory that trusts its bytes (for benchmarks
// of the levels above it).
type memSource []byte

func (m memSource) Has(Key) bool { return true }
func (m memSource) Read(_ context.Context, k Key, dst []byte) error {
	copy(dst, m[k.Off:k.Off+k.Len])
	return nil
}

// BenchmarkPolicyEviction replays the synthetic DeepSeek-V3-shaped trace
// (14848 expert keys) at 25% and 50% of its keys under the cycle policy
// and under GDSF (cost, a heap of scores) and reports the time a replayed
// access takes and cycle's as a ratio of GDSF's (x-of-cost), measured in
// the same run: cycle picks each victim itself (an AgingPolicy), so its
// cost grows with what the level holds.
func BenchmarkPolicyEviction(b *testing.B) {
	tr, err := SyntheticMoETrace(DeepSeekMoETrace)
	if err != nil {
		b.Fatal(err)
	}
	total := int64(len(tr.Keys)) * DeepSeekMoETrace.ExpertBytes
	for _, frac := range []float64{0.25, 0.5} {
		b.Run(fmt.Sprintf("keys=%d", int(frac*float64(len(tr.Keys)))), func(b *testing.B) {
			budget := int64(frac * float64(total))
			timed := func(policy string) (time.Duration, SimResult) {
				t0 := time.Now()
				r := Simulate(tr, mustPolicy(policy), budget)
				return time.Since(t0), r
			}
			var cyc, cost, fc time.Duration
			var ev, fev int
			for i := 0; i < b.N; i++ {
				d, r := timed("cycle")
				cyc += d
				ev += r.Evictions
				d, _ = timed("cost")
				cost += d
				d, r = timed("forecast")
				fc += d
				fev += r.Evictions
			}
			n := float64(b.N * len(tr.Accesses))
			b.ReportMetric(float64(cyc.Nanoseconds())/n, "cycle-ns/access")
			b.ReportMetric(float64(cyc.Nanoseconds())/float64(max(ev, 1)), "cycle-ns/eviction")
			b.ReportMetric(float64(cost.Nanoseconds())/n, "cost-ns/access")
			b.ReportMetric(cyc.Seconds()/cost.Seconds(), "x-of-cost")
			// forecast scans the level for each victim and learns over
			// every key at each step's end.
			b.ReportMetric(float64(fc.Nanoseconds())/float64(max(fev, 1)), "forecast-ns/eviction")
			b.ReportMetric(fc.Seconds()/cost.Seconds(), "forecast-x-of-cost")
		})
	}
}
