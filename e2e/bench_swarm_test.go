package e2e

import (
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

// BenchmarkSwarm measures 1 -> 9 on loopback, each peer its own process:
// one `peer daemon` seeds a file (RDRR_BENCH_BYTES, default 1 GiB) and
// nine `peer get` processes, started at once, fetch it through the
// signaling server. Measured in the same run, as the limit: one process
// writing the same bytes to nine TCP connections at once.
//
// It reports the seconds until the last `peer get` exited, the aggregate
// rate (nine copies over those seconds), the copies the seeder served
// (the rest the leechers served each other), the CPU seconds of all ten
// processes, and the ratio to TCP. After the timing, every leecher's
// store is checked against the file. Then, as a second limit, one
// process writes the same bytes to a new file (what each leecher's store
// must do at least): on this VM, writing into page-cache pages the
// hypervisor has not backed yet costs ten times what writing into ones it
// has does (swarm/BENCHMARKS.md, 2026-11-27 evening), and the swarm's CPU
// follows. RDRR_BENCH_LEECHERS sets another
// number of leechers (1..64), to see how the cost grows with the swarm.
func BenchmarkSwarm(b *testing.B) {
	leechers := 9
	if v, err := strconv.Atoi(os.Getenv("RDRR_BENCH_LEECHERS")); err == nil && v >= 1 && v <= 64 {
		leechers = v
	}
	peer := peerBinary(b)
	size := benchBytes()
	dir := b.TempDir()
	path := writeRandomFile(b, dir, 99, size)
	want := hashFile(b, path)
	names := make([]string, leechers+1) // homes[0] seeds
	for i := range names {
		names[i] = "h" + strconv.Itoa(i)
	}
	homes := initHomes(b, peer, dir, names...)
	c := peerAdd(b, peer, homes[0], path)
	cid := c.String()
	os.Remove(path)

	tcp := measureTCPFanout(b, size, leechers)

	url := startSignal(b)
	// Warnings only: the benchmark's log keeps its last lines.
	seeder := startDaemon(b, peer, homes[0], "--signal", url, "--log-level", "warn")
	for deadline := time.Now().Add(30 * time.Second); !seeder.status(b).Online; {
		if time.Now().After(deadline) {
			b.Fatal("the seeder is not online after 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	served0, seedCPU0 := seeder.status(b).Swarm.ServedBytes, cpuOf(seeder.cmd.Process.Pid)

	b.ResetTimer()
	start := time.Now()
	cmds := make([]*exec.Cmd, leechers)
	for i := range cmds {
		cmds[i] = exec.Command(peer, "--home", homes[1+i], "--log-level", "warn", "get", cid, "-o", os.DevNull, "--signal", url)
		cmds[i].Stderr = tWriter{b, "get" + strconv.Itoa(i)}
		if err := cmds[i].Start(); err != nil {
			b.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, leechers)
	done := make([]time.Duration, leechers)
	for i, cmd := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Wait()
			done[i] = time.Since(start)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	b.StopTimer()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("peer get %d: %v", i, err)
		}
	}
	served := seeder.status(b).Swarm.ServedBytes - served0
	cpu := cpuOf(seeder.cmd.Process.Pid) - seedCPU0
	for _, cmd := range cmds {
		cpu += (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	for i, h := range homes[1:] {
		st, err := cas.Open(h, cas.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if got := hashStored(b, st, c); got != want {
			b.Fatalf("leecher %d's copy hashes to %x; want %x", i, got, want)
		}
		st.Close()
	}

	disk, diskSys := measureFileWrite(b, dir, size)

	all := float64(leechers) * float64(size)
	rate := all / took.Seconds() / 1e6
	tcpRate := all / tcp.Seconds() / 1e6
	b.ReportMetric(took.Seconds(), "s")
	b.ReportMetric(rate, "MB/s")
	b.ReportMetric(float64(served)/float64(size), "seeder-copies")
	b.ReportMetric(cpu, "cpu-s")
	b.ReportMetric(tcp.Seconds(), "tcp-s")
	b.ReportMetric(rate/tcpRate, "x-of-tcp")
	b.ReportMetric(disk.Seconds(), "file-s")
	b.Logf("1 -> %d of %d MiB, each peer a process, on loopback:", leechers, size>>20)
	b.Logf("  tcp    %6.1f s  %6.0f MB/s  one process writing to %d connections at once", tcp.Seconds(), tcpRate, leechers)
	b.Logf("  swarm  %6.1f s  %6.0f MB/s  %.3fx of tcp; %d `peer get` from one `peer daemon`; the seeder served %.2f copies (%.0f%% of the bytes), the leechers %.2f; CPU %.1f s in all (the seeder %.1f s)",
		took.Seconds(), rate, rate/tcpRate, leechers, float64(served)/float64(size), 100*float64(served)/all, (all-float64(served))/float64(size), cpu, cpuOf(seeder.cmd.Process.Pid)-seedCPU0)
	b.Logf("  file   %6.1f s  %6.0f MB/s  one process writing the same bytes to a new file (system CPU %.1f s; each leecher's store writes that much)", disk.Seconds(), float64(size)/disk.Seconds()/1e6, diskSys.Seconds())
	slowest := make([]string, leechers)
	for i, d := range done {
		slowest[i] = d.Round(100 * time.Millisecond).String()
	}
	b.Logf("  each get ended after: %s", strings.Join(slowest, " "))
}

// measureFileWrite returns how long writing n bytes to a new file in dir
// takes, 1 MiB at a time without a sync, and the system CPU time it took;
// the file is removed.
func measureFileWrite(b *testing.B, dir string, n int64) (took, sys time.Duration) {
	f, err := os.CreateTemp(dir, "file-write-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 131)
	}
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	for left := n; left > 0; left -= int64(len(buf)) {
		if _, err := f.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			b.Fatal(err)
		}
	}
	took = time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	return took, time.Duration(ru1.Stime.Nano() - ru0.Stime.Nano())
}

// measureTCPFanout returns how long one child takes to write n bytes to
// each of k TCP connections to us, all at once.
func measureTCPFanout(b *testing.B, n int64, k int) time.Duration {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	addrs := make([]string, k)
	for i := range addrs {
		addrs[i] = ln.Addr().String()
	}
	startChild(b, "tcp-send", envAddr+"="+strings.Join(addrs, ","), envBytes+"="+strconv.FormatInt(n, 10))
	var start time.Time
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for i := range k {
		conn, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		if i == 0 {
			start = time.Now()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			got, err := io.CopyBuffer(io.Discard, conn, make([]byte, 1<<20))
			if err == nil && got != n {
				err = io.ErrUnexpectedEOF
			}
			errs <- err
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatalf("tcp fan-out: %v", err)
		}
	}
	return took
}
