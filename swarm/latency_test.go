package swarm

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	piontransport "github.com/pion/transport/v4"
)

// delayConn delays every datagram it sends by d, in order: between two
// nodes whose sockets both delay, a path with a round trip of 2d.
// Datagrams beyond a bounded queue are dropped, as a router's would be.
type delayConn struct {
	piontransport.UDPConn
	d    time.Duration
	q    chan delayed
	done chan struct{}
	once sync.Once
}

type delayed struct {
	at time.Time
	p  []byte
	to net.Addr
}

func delayUDP(d time.Duration) func(piontransport.UDPConn) piontransport.UDPConn {
	return func(c piontransport.UDPConn) piontransport.UDPConn {
		dc := &delayConn{UDPConn: c, d: d, q: make(chan delayed, 1<<14), done: make(chan struct{})}
		go dc.run()
		return dc
	}
}

func (c *delayConn) run() {
	for {
		select {
		case x := <-c.q:
			if w := time.Until(x.at); w > 0 {
				select {
				case <-time.After(w):
				case <-c.done:
					return
				}
			}
			c.UDPConn.WriteTo(x.p, x.to)
		case <-c.done:
			return
		}
	}
}

func (c *delayConn) WriteTo(p []byte, to net.Addr) (int, error) {
	select {
	case c.q <- delayed{time.Now().Add(c.d), bytes.Clone(p), to}:
	default:
	}
	return len(p), nil
}

func (c *delayConn) WriteToUDP(p []byte, to *net.UDPAddr) (int, error) { return c.WriteTo(p, to) }

func (c *delayConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.UDPConn.Close()
}

// fetchWithRTT fetches size bytes from a seeder into n leechers at once
// (two or more trade pieces, so each peer's pipeline is sized by its
// bandwidth x round trip, pipeline.go; one alone gets every worker),
// every node's sockets delaying what they send by rtt/2, and returns the
// time until all are done.
func fetchWithRTT(tb testing.TB, url string, rtt time.Duration, size, n int) time.Duration {
	tb.Helper()
	mod := func(c *Config) {
		if rtt > 0 {
			c.testHooks.wrapUDP = delayUDP(rtt / 2)
		}
	}
	seed := newTestNode(tb, url, mod)
	data := randBytes(uint64(size), size)
	inf := put(tb, seed.st, data)
	leechers := make([]*testNode, n)
	for i := range leechers {
		leechers[i] = newTestNode(tb, url, mod)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, l := range leechers {
		peers := []peer.ID{seed.ID()}
		for _, o := range leechers {
			if o != l {
				peers = append(peers, o.ID())
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = l.Fetch(ctxFor(tb, 5*time.Minute), l.st, inf.CID, FetchOptions{Peers: peers})
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for i, l := range leechers {
		if errs[i] != nil {
			tb.Fatalf("leecher %d at RTT %v: %v", i, rtt, errs[i])
		}
		if !bytes.Equal(readAll(tb, l.st, inf.CID), data) {
			tb.Fatalf("leecher %d at RTT %v: copy differs", i, rtt)
		}
	}
	return took
}

// Fetches complete across a path with a round trip of 80 ms (each
// node's sockets delaying what they send).
func TestFetchAcrossRTT(t *testing.T) {
	if testing.Short() {
		t.Skip("short: a fetch across an 80 ms round trip")
	}
	took := fetchWithRTT(t, startSignal(t), 80*time.Millisecond, 8<<20, 2)
	t.Logf("1 seeder -> 2 leechers of 8 MiB across an 80 ms round trip: %v", took)
}

// BenchmarkRTT measures, in one process, 1 seeder -> 1 leecher and 1
// seeder -> 2 trading leechers, with every node's sockets delaying what
// they send: round trips of 0 (the limit, measured in the same run), 20,
// 80 and 200 ms. Reported as MB/s (all copies) and as the ratio of each
// to round trip 0 (x-of-rtt0). RDRR_BENCH_BYTES sets the size (default
// 64 MiB).
func BenchmarkRTT(b *testing.B) {
	size := 64 << 20
	if v, err := strconv.Atoi(os.Getenv("RDRR_BENCH_BYTES")); err == nil && v > 0 {
		size = v
	}
	url := startSignal(b)
	for b.Loop() {
		for _, n := range []int{1, 2} {
			var base float64
			for _, rtt := range []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond, 200 * time.Millisecond} {
				took := fetchWithRTT(b, url, rtt, size, n)
				mbs := float64(n) * float64(size) / took.Seconds() / 1e6
				if rtt == 0 {
					base = mbs
				}
				name := fmt.Sprintf("1to%d-rtt%dms", n, rtt.Milliseconds())
				b.ReportMetric(mbs, name+"-MB/s")
				b.ReportMetric(mbs/base, name+"-x-of-rtt0")
				b.Logf("1 -> %d, RTT %v: %.2f s, %.0f MB/s, %.2fx of RTT 0", n, rtt, took.Seconds(), mbs, mbs/base)
			}
		}
	}
}
