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
// peer its own process on loopback: N `peer daemon`s (RDRR_BENCH_SEEDERS,
// default 3) each store the same file (RDRR_BENCH_BYTES, default 1 GiB);
// one `peer get` fetches it while only the first seeder is online, then
// another `peer get`, into a fresh store, once all N are. It reports both
// times, their ratio (how much a fetch gains from more seeders), the
// share of the bytes each seeder served in the N -> 1 fetch, and the CPU
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
	seeds := make([]string, n)
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

	sigAddr := freeAddr(b)
	sig := exec.Command(peer, "signal", "--listen", sigAddr)
	sig.Stderr = tWriter{b, "signal"}
	if err := sig.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sig.Process.Kill(); sig.Wait() })
	url := "ws://" + sigAddr
	daemons := make([]*daemon, n)
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
	fetch := func(name string) (time.Duration, []int64, float64) {
		h := home(name)
		served0, cpu0 := make([]int64, n), 0.0
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
		served := make([]int64, n)
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

	b.ResetTimer()
	daemons[0] = startDaemon(b, peer, seeds[0], "--signal", url, "--log-level", "warn")
	online(daemons[0])
	one, _, cpu1 := fetch("one")
	for i := 1; i < n; i++ {
		daemons[i] = startDaemon(b, peer, seeds[i], "--signal", url, "--log-level", "warn")
	}
	for _, d := range daemons {
		online(d)
	}
	many, served, cpuN := fetch("many")
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
