package e2e

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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

	tcp := medianOf(runs, func() float64 { return measureTCP(b, size) })
	naive := medianOf(runs, func() float64 { return measureNaive(b, size/4) })

	srv := startChild(b, "serve", envHome+"="+homeA, envSignal+"="+url, envTopic+"=bench")
	ready := strings.Fields(srv.expect("ready", 30*time.Second)) // peer id, SCTP MTU
	id, err := peer.Decode(ready[0])
	if err != nil {
		b.Fatal(err)
	}
	bigMTU, _ := strconv.Atoi(ready[1])
	fetch := func(tweak func(*swarm.Config)) float64 {
		node := newLocalNodeWith(b, url, b.TempDir(), "bench", tweak)
		defer node.st.Close()
		defer node.Close()
		start := time.Now()
		if _, err := node.Fetch(ctxFor(b, 10*time.Minute), node.st, c, swarm.FetchOptions{Peers: []peer.ID{id}}); err != nil {
			b.Fatal(err)
		}
		mbs := float64(size) / time.Since(start).Seconds() / 1e6
		if got := hashStored(b, node.st, c); got != want {
			b.Fatalf("fetched file hashes to %x; want %x", got, want)
		}
		return mbs
	}
	b.ResetTimer()
	ours := medianOf(runs, func() float64 { return fetch(nil) })
	small := medianOf(runs, func() float64 { return fetch(func(c *swarm.Config) { c.BigMTU = -1 }) })
	b.StopTimer()

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
func hashFile(b *testing.B, path string) [32]byte {
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
func hashStored(b *testing.B, st *cas.Store, c cas.CID) [32]byte {
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
