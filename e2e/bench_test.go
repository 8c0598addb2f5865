package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
	"github.com/zeebo/blake3"
)

// Sizes: the fetch moves 1 GiB (RDRR_BENCH_BYTES overrides); TCP the same;
// the naive channel a quarter (it is several times slower, and its rate is
// what counts).
func benchBytes() int64 {
	if v, err := strconv.ParseInt(os.Getenv("RDRR_BENCH_BYTES"), 10, 64); err == nil && v > 0 {
		return v
	}
	return 1 << 30
}

// benchRuns is how many times each row runs (RDRR_BENCH_RUNS, default 3);
// the median is reported.
func benchRuns() int {
	if v, err := strconv.Atoi(os.Getenv("RDRR_BENCH_RUNS")); err == nil && v > 0 {
		return v
	}
	return 3
}

// BenchmarkTransport measures, in one run, between two processes on
// loopback:
//
//   - tcp: a raw TCP copy on one connection (the limit of the loopback);
//   - naive: one data channel of a default pion peer connection (1191-byte
//     SCTP packets, default socket buffers), timed from the offer, so
//     connection setup is inside the timing as it is for the fetch;
//   - fetch: this transport's verified fetch of a 1 GiB file (16 shards and
//     a collection) into a cas store, with the defaults a native peer gets
//     on loopback (big SCTP packets where both ends announce them);
//   - fetch-small: the same fetch with big packets off, which is what
//     browsers and peers across the internet get.
//
// Each row runs RDRR_BENCH_RUNS times and reports its median. After each
// fetch (outside the timing) the fetched file is read back and its BLAKE3
// compared with the source's. The log names every row's settings.
func BenchmarkTransport(b *testing.B) {
	size := benchBytes()
	runs := benchRuns()
	path := writeRandomFile(b, b.TempDir(), 42, size)
	want := hashFile(b, path)
	homeA, c := newHome(b, path)
	os.Remove(path)
	url := startSignal(b)

	// RDRR_BENCH_FETCH_ONLY=1 runs tcp and fetch only (to profile the
	// fetch: RDRR_BENCH_SERVE_PROFILE and -cpuprofile).
	fetchOnly := os.Getenv("RDRR_BENCH_FETCH_ONLY") != ""
	tcp := medianOf(runs, func() float64 { return measureTCP(b, size) })
	naive := math.NaN()
	if !fetchOnly {
		naive = medianOf(runs, func() float64 { return measureNaive(b, size/4) })
	}

	srvEnv := []string{envHome + "=" + homeA, envSignal + "=" + url, envTopic + "=bench"}
	if path := os.Getenv("RDRR_BENCH_SERVE_PROFILE"); path != "" {
		srvEnv = append(srvEnv, envCPUProfile+"="+path) // the seeder's CPU profile
	}
	srv := startChild(b, "serve", srvEnv...)
	ready := strings.Fields(srv.expect("ready", 30*time.Second)) // peer id, SCTP MTU
	id, err := peer.Decode(ready[0])
	if err != nil {
		b.Fatal(err)
	}
	bigMTU, _ := strconv.Atoi(ready[1])
	// CPU seconds of both processes, per fetch (the median is reported).
	var cpuBoth []float64
	fetch := func(tweak func(*swarm.Config)) float64 {
		node := newLocalNodeWith(b, url, b.TempDir(), "bench", tweak)
		defer node.st.Close()
		defer node.Close()
		self0, seed0 := cpuSelf(), cpuOf(srv.cmd.Process.Pid)
		start := time.Now()
		if _, err := node.Fetch(ctxFor(b, 10*time.Minute), node.st, c, swarm.FetchOptions{Peers: []peer.ID{id}}); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		fetcher, seeder := cpuSelf()-self0, cpuOf(srv.cmd.Process.Pid)-seed0
		if tweak == nil {
			cpuBoth = append(cpuBoth, fetcher+seeder)
		}
		mbs := float64(size) / took.Seconds() / 1e6
		b.Logf("fetch (big packets %v): %.2f s, %.0f MB/s, CPU %.2f s fetcher + %.2f s seeder", tweak == nil, took.Seconds(), mbs, fetcher, seeder)
		if got := hashStored(b, node.st, c); got != want {
			b.Fatalf("fetched file hashes to %x; want %x", got, want)
		}
		return mbs
	}
	b.ResetTimer()
	ours := medianOf(runs, func() float64 { return fetch(nil) })
	cpu := median(cpuBoth)
	small := math.NaN()
	if !fetchOnly {
		small = medianOf(runs, func() float64 { return fetch(func(c *swarm.Config) { c.BigMTU = -1 }) })
	}
	b.StopTimer()
	b.ReportMetric(cpu, "cpu-s")
	b.ReportMetric(float64(size)/1e6/cpu, "MB-per-cpu-s")

	b.ReportMetric(ours, "MB/s")
	b.ReportMetric(small, "small-packets-MB/s")
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(naive, "naive-MB/s")
	b.ReportMetric(ours/naive, "x-of-naive")
	b.ReportMetric(small/naive, "small-packets-x-of-naive")
	b.ReportMetric(ours/tcp, "x-of-tcp")
	b.ReportMetric(float64(bigMTU), "sctp-mtu")
	d := swarm.Defaults()
	b.Logf("medians of %d runs, %d MiB each (naive %d MiB), two processes on loopback:", runs, size>>20, size>>22)
	b.Logf("  tcp          %7.0f MB/s  one TCP connection, 1 MiB reads", tcp)
	b.Logf("  naive        %7.0f MB/s  one default pion connection and channel, 1191-byte SCTP packets, default socket buffers, 64 KiB messages; setup timed", naive)
	b.Logf("  fetch        %7.0f MB/s  %.2fx of naive, %.3fx of tcp; %d connections x %d bulk channels, %d-byte SCTP packets, %d MiB socket buffers, %d KiB pieces, window %d; setup timed; verified into a store", ours, ours/naive, ours/tcp, d.Links, d.BulkChannels, max(bigMTU, 1191), d.SocketBuffer>>20, d.PieceSize>>10, d.Window)
	b.Logf("  fetch-small  %7.0f MB/s  %.2fx of naive; as fetch with big packets off (1191-byte SCTP packets), what browsers and internet peers get", small, small/naive)
}

// cpuSelf returns the CPU seconds (user and system) this process used.
func cpuSelf() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// cpuOf returns the CPU seconds process pid used (Linux /proc; 0 if it
// cannot be read).
func cpuOf(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (which may hold spaces), from field 3.
	fs := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fs) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(fs[11], 64)
	st, _ := strconv.ParseFloat(fs[12], 64)
	return (ut + st) / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times (100 on
// every Linux this runs on).
const clockTicks = 100

// medianOf returns the median of n calls of f.
func medianOf(n int, f func() float64) float64 {
	xs := make([]float64, n)
	for i := range xs {
		xs[i] = f()
	}
	slices.Sort(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// hashFile returns the BLAKE3 of the file at path.
func hashFile(b testing.TB, path string) [32]byte {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	h := blake3.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 1<<20)); err != nil {
		b.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// hashStored returns the BLAKE3 of file c as the store reads it back.
func hashStored(b testing.TB, st *cas.Store, c cas.CID) [32]byte {
	fr, err := st.OpenFile(c)
	if err != nil {
		b.Fatal(err)
	}
	h := blake3.New()
	if _, err := io.CopyBuffer(h, io.NewSectionReader(fr, 0, fr.Size()), make([]byte, 1<<20)); err != nil {
		b.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// measureTCP returns MB/s of a child writing n bytes to us over TCP.
func measureTCP(b *testing.B, n int64) float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	startChild(b, "tcp-send", envAddr+"="+ln.Addr().String(), envBytes+"="+strconv.FormatInt(n, 10))
	conn, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	got, err := io.CopyBuffer(io.Discard, conn, make([]byte, 1<<20))
	if err != nil || got != n {
		b.Fatalf("tcp: got %d of %d bytes: %v", got, n, err)
	}
	return float64(n) / time.Since(start).Seconds() / 1e6
}

// measureNaive returns MB/s of a child sending n bytes to us on one data
// channel of a default pion peer connection.
func measureNaive(b *testing.B, n int64) float64 {
	sender := startChild(b, "naive-send", envBytes+"="+strconv.FormatInt(n, 10))
	start := time.Now()
	pc, err := naiveAPI().NewPeerConnection(webrtc.Configuration{})
	if err != nil {
		b.Fatal(err)
	}
	defer pc.Close()
	dc, err := pc.CreateDataChannel("naive", nil)
	if err != nil {
		b.Fatal(err)
	}
	opened := make(chan time.Time, 1)
	done := make(chan time.Time, 1)
	var got atomic.Int64
	dc.OnOpen(func() { opened <- time.Now() })
	dc.OnMessage(func(m webrtc.DataChannelMessage) {
		if got.Add(int64(len(m.Data))) == n {
			done <- time.Now()
		}
	})
	offer, err := pc.CreateOffer(nil)
	if err != nil {
		b.Fatal(err)
	}
	gathered := webrtc.GatheringCompletePromise(pc)
	if err := pc.SetLocalDescription(offer); err != nil {
		b.Fatal(err)
	}
	<-gathered
	line, _ := json.Marshal(pc.LocalDescription())
	sender.stdin.Write(append(line, '\n'))
	var answer webrtc.SessionDescription
	if err := json.Unmarshal([]byte(sender.expect("answer", 30*time.Second)), &answer); err != nil {
		b.Fatal(err)
	}
	if err := pc.SetRemoteDescription(answer); err != nil {
		b.Fatal(err)
	}
	var end time.Time
	select {
	case <-opened:
	case <-time.After(30 * time.Second):
		b.Fatal("naive channel did not open")
	}
	select {
	case end = <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("naive channel: %d of %d bytes", got.Load(), n)
	}
	sender.stop(5 * time.Second)
	return float64(n) / end.Sub(start).Seconds() / 1e6
}
