package e2e

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/swarm"
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

// BenchmarkTransport measures, in one run, between two processes on
// loopback: a raw TCP copy, one default pion data channel (the naive
// baseline), and this transport's verified fetch of a 1 GiB file (16 shards
// and a collection) into a cas store. It reports the fetch's MB/s and its
// ratios to both limits.
func BenchmarkTransport(b *testing.B) {
	size := benchBytes()
	path := writeRandomFile(b, b.TempDir(), 42, size)
	homeA, c := newHome(b, path)
	os.Remove(path)
	url := startSignal(b)

	tcp := measureTCP(b, size)
	naive := measureNaive(b, size/4)

	srv := startChild(b, "serve", envHome+"="+homeA, envSignal+"="+url, envTopic+"=bench")
	ready := strings.Fields(srv.expect("ready", 30*time.Second)) // peer id, SCTP MTU
	id, err := peer.Decode(ready[0])
	if err != nil {
		b.Fatal(err)
	}
	bigMTU, _ := strconv.Atoi(ready[1])
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		node := newLocalNode(b, url, b.TempDir(), "bench")
		b.StartTimer()
		start := time.Now()
		if _, err := node.Fetch(ctxFor(b, 10*time.Minute), node.st, c, swarm.FetchOptions{Peers: []peer.ID{id}}); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(start)
		b.StopTimer()
		node.Close()
		node.st.Close()
	}
	ours := float64(size) * float64(b.N) / elapsed.Seconds() / 1e6
	b.ReportMetric(ours, "MB/s")
	b.ReportMetric(tcp, "tcp-MB/s")
	b.ReportMetric(naive, "naive-MB/s")
	b.ReportMetric(ours/naive, "x-of-naive")
	b.ReportMetric(ours/tcp, "x-of-tcp")
	b.ReportMetric(float64(bigMTU), "sctp-mtu")
	b.Logf("1 GiB verified fetch %.0f MB/s (SCTP MTU %d), TCP %.0f MB/s, one default pion channel %.0f MB/s", ours, max(bigMTU, 1191), tcp, naive)
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
	sender := startChild(b, "naive-send", envBytes+"="+strconv.FormatInt(n, 10))
	line, _ := json.Marshal(pc.LocalDescription())
	sender.stdin.Write(append(line, '\n'))
	var answer webrtc.SessionDescription
	if err := json.Unmarshal([]byte(sender.expect("answer", 30*time.Second)), &answer); err != nil {
		b.Fatal(err)
	}
	if err := pc.SetRemoteDescription(answer); err != nil {
		b.Fatal(err)
	}
	var start, end time.Time
	select {
	case start = <-opened:
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
