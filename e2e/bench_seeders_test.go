package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

// BenchmarkSeeders measures N -> 1 against 1 -> 1 in the same run, each
// peer its own process on loopback: N + 1 `peer daemon`s each store the
// same file (RDRR_BENCH_BYTES, default 1 GiB); one of them seeds a swarm
// of its own (its own signaling server) and N (RDRR_BENCH_SEEDERS,
// default 3) another; one `peer get` fetches the file from each swarm,
// into a fresh store. Separate swarms keep the second fetch from meeting
// the first one's peers: a peer that has exited but is still listed (its
// provider records outlive it) cost a fetch ~4 s of setup here. It
// reports both times, their ratio (how much a fetch gains from more
// seeders), the share of the bytes each of the N served, and the CPU
// seconds of each fetch's processes. Both copies are checked against the
// file.
func BenchmarkSeeders(b *testing.B) {
	n := 3
	if s := os.Getenv("RDRR_BENCH_SEEDERS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 2 || v > 16 {
			b.Fatalf("RDRR_BENCH_SEEDERS=%q: want 2 to 16", s)
		}
		n = v
	}
	peer := peerBinary(b)
	size := benchBytes()
	dir := b.TempDir()
	path := writeRandomFile(b, dir, 77, size)
	want := hashFile(b, path)
	home := func(name string) string {
		h := filepath.Join(dir, name)
		if out, err := exec.Command(peer, "--home", h, "init").CombinedOutput(); err != nil {
			b.Fatalf("peer init: %v %s", err, out)
		}
		return h
	}
	seeds := make([]string, n+1) // seeds[0] alone, the others together
	var cid string
	for i := range seeds {
		seeds[i] = home("s" + strconv.Itoa(i))
		out, err := exec.Command(peer, "--home", seeds[i], "add", "--json", "-q", path).Output()
		if err != nil {
			b.Fatalf("peer add: %v", err)
		}
		var added []struct{ CID string }
		json.Unmarshal(out, &added)
		if len(added) != 1 || (cid != "" && added[0].CID != cid) {
			b.Fatalf("peer add printed %s", out)
		}
		cid = added[0].CID
	}
	c, err := cas.ParseCID(cid)
	if err != nil {
		b.Fatal(err)
	}
	os.Remove(path)

	online := func(d *daemon) {
		for deadline := time.Now().Add(30 * time.Second); !d.status(b).Online; {
			if time.Now().After(deadline) {
				b.Fatal("a seeder is not online after 30 s")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// fetch runs one `peer get` into a fresh store and returns its time,
	// the bytes each seeder served meanwhile, and the CPU seconds of the
	// fetcher and the seeders.
	fetch := func(name, url string, daemons []*daemon) (time.Duration, []int64, float64) {
		h := home(name)
		served0, cpu0 := make([]int64, len(daemons)), 0.0
		for i, d := range daemons {
			if d != nil {
				served0[i] = d.status(b).Swarm.ServedBytes
				cpu0 += cpuOf(d.cmd.Process.Pid)
			}
		}
		start := time.Now()
		cmd := exec.Command(peer, "--home", h, "--log-level", "warn", "get", cid, "-o", os.DevNull, "--signal", url)
		cmd.Stderr = tWriter{b, name}
		if err := cmd.Run(); err != nil {
			b.Fatalf("peer get (%s): %v", name, err)
		}
		took := time.Since(start)
		cpu := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds() - cpu0
		served := make([]int64, len(daemons))
		for i, d := range daemons {
			if d != nil {
				served[i] = d.status(b).Swarm.ServedBytes - served0[i]
				cpu += cpuOf(d.cmd.Process.Pid)
			}
		}
		st, err := cas.Open(h, cas.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		if got := hashStored(b, st, c); got != want {
			b.Fatalf("%s's copy hashes to %x; want %x", name, got, want)
		}
		return took, served, cpu
	}

	// swarm starts daemons on homes, with a signaling server of their own.
	swarm := func(homes []string) (string, []*daemon) {
		url := startSignal(b)
		ds := make([]*daemon, len(homes))
		for i, h := range homes {
			ds[i] = startDaemon(b, peer, h, "--signal", url, "--log-level", "warn")
		}
		for _, d := range ds {
			online(d)
		}
		return url, ds
	}
	b.ResetTimer()
	url1, alone := swarm(seeds[:1])
	one, _, cpu1 := fetch("one", url1, alone)
	urlN, together := swarm(seeds[1:])
	many, served, cpuN := fetch("many", urlN, together)
	b.StopTimer()

	mb := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }
	b.ReportMetric(one.Seconds(), "1to1-s")
	b.ReportMetric(many.Seconds(), strconv.Itoa(n)+"to1-s")
	b.ReportMetric(one.Seconds()/many.Seconds(), "x-of-1to1")
	shares := ""
	for i, s := range served {
		b.ReportMetric(float64(s)/float64(size), "seeder"+strconv.Itoa(i)+"-copies")
		shares += " " + strconv.FormatFloat(100*float64(s)/float64(size), 'f', 0, 64) + "%"
	}
	b.Logf("%d MiB on loopback, each peer a process:", size>>20)
	b.Logf("  1 -> 1  %6.1f s  %5.0f MB/s  CPU %.1f s", one.Seconds(), mb(one), cpu1)
	b.Logf("  %d -> 1  %6.1f s  %5.0f MB/s  CPU %.1f s; %.2fx of 1 -> 1; the seeders served%s", n, many.Seconds(), mb(many), cpuN, one.Seconds()/many.Seconds(), shares)
}
