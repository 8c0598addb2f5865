package swarm

import (
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	piontransport "github.com/pion/transport/v4"
)

// Big packets go both ways on loopback: the peer that dialed (and made its
// connection before it knew what the other end reads) sends them too, once
// the answer announced a big recv_mtu. It sent 1191-byte packets before,
// so that in a swarm half of what leechers served each other went in
// packets a fourteenth the size (swarm/BENCHMARKS.md).
func TestBigMTUFromDialer(t *testing.T) {
	if !bigMTUSupported() {
		t.Skip("this build's pion cannot send big SCTP packets (build with make)")
	}
	url := startSignal(t)
	var largest atomic.Int64
	dialer := newTestNode(t, url, func(c *Config) {
		c.Links = 1
		c.testHooks.wrapUDP = func(c piontransport.UDPConn) piontransport.UDPConn {
			return &sizeConn{UDPConn: c, largest: &largest}
		}
	})
	answerer := newTestNode(t, url, func(c *Config) { c.Links = 1 })
	inf := put(t, dialer.st, randBytes(23, 1<<20))
	if err := dialer.Connect(ctxFor(t, 20*time.Second), answerer.ID()); err != nil {
		t.Fatal(err)
	}
	var l *link
	for i := 0; i < 500 && l == nil; i++ {
		if ls := answerer.linksTo(dialer.ID()); len(ls) > 0 {
			l = ls[0]
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if l == nil {
		t.Fatal("the answerer has no link to the dialer")
	}
	if _, err := l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := largest.Load(), int64(dialer.tr.bigMTU); got < want {
		t.Fatalf("the dialer served 1 MiB in datagrams of at most %d bytes; want SCTP packets of %d", got, want)
	}
}

// A dialer that sends big packets falls back too: when the peer it dialed
// announced a big recv_mtu but reads 1500-byte datagrams, the dialer sees
// what it serves go unacknowledged, closes the link, and sends that peer
// default-size packets on its next connection.
func TestBigMTUFallbackFromDialer(t *testing.T) {
	if !bigMTUSupported() {
		t.Skip("this build's pion cannot send big SCTP packets (build with make)")
	}
	url := startSignal(t)
	dialer := newTestNode(t, url, func(c *Config) {
		c.Links = 1
		c.testHooks.bigMTUProbe = 2 * time.Second
	})
	answerer := newTestNode(t, url, func(c *Config) {
		c.Links = 1
		c.RequestTimeout = 20 * time.Second
		c.testHooks.receiveMTU = 1500
	})
	inf := put(t, dialer.st, randBytes(24, 1<<20))
	linkFrom := func() *link {
		t.Helper()
		if err := dialer.Connect(ctxFor(t, 20*time.Second), answerer.ID()); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 500; i++ {
			if ls := answerer.linksTo(dialer.ID()); len(ls) > 0 {
				return ls[0]
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatal("the answerer has no link to the dialer")
		return nil
	}
	_, err := linkFrom().request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil)
	if !errors.Is(err, ErrLinkClosed) || errors.Is(err, ErrRequestTimeout) {
		t.Fatalf("request over big packets the answerer cannot read: %v; want the link closed by the dialer", err)
	}
	if !hasEvent(dialer.Node, EventNoBigMTU, answerer.ID(), "") {
		t.Fatalf("dialer recorded no fallback: %+v", dialer.Events())
	}
	for i := 0; i < 500 && dialer.Links(answerer.ID()) > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := linkFrom().request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil); err != nil {
		t.Fatalf("request after the fallback: %v", err)
	}
}

// sizeConn records the largest datagram written through it.
type sizeConn struct {
	piontransport.UDPConn
	largest *atomic.Int64
}

func (c *sizeConn) WriteTo(p []byte, to net.Addr) (int, error) {
	for n := int64(len(p)); ; {
		old := c.largest.Load()
		if n <= old || c.largest.CompareAndSwap(old, n) {
			break
		}
	}
	return c.UDPConn.WriteTo(p, to)
}

func (c *sizeConn) WriteToUDP(p []byte, to *net.UDPAddr) (int, error) { return c.WriteTo(p, to) }

// A peer that announces a big recv_mtu but reads 1500-byte datagrams (stock
// pion following the old spec) does not stall forever: the seeder sees its
// big packets go unacknowledged, closes the link and answers the peer's
// next connection with default-size packets.
func TestBigMTUFallback(t *testing.T) {
	if !bigMTUSupported() {
		t.Skip("this build's pion cannot send big SCTP packets (build with make)")
	}
	url := startSignal(t)
	seeder := newTestNode(t, url, func(c *Config) { c.testHooks.bigMTUProbe = 2 * time.Second })
	fetcher := newTestNode(t, url, func(c *Config) {
		c.Links = 1
		c.RequestTimeout = 20 * time.Second
		c.testHooks.receiveMTU = 1500
	})
	if fetcher.tr.recvMTU < seeder.tr.bigMTU+dtlsOverhead {
		t.Fatalf("fetcher announces recv_mtu %d: too small to get big packets", fetcher.tr.recvMTU)
	}
	inf := put(t, seeder.st, randBytes(21, 1<<20))
	if err := fetcher.Connect(ctxFor(t, 20*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	l := fetcher.linksTo(seeder.ID())[0]
	_, err := l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil)
	if !errors.Is(err, ErrLinkClosed) || errors.Is(err, ErrRequestTimeout) {
		t.Fatalf("request over big packets the fetcher cannot read: %v; want the link closed by the seeder", err)
	}
	if !hasEvent(seeder.Node, EventNoBigMTU, fetcher.ID(), "") {
		t.Fatalf("seeder recorded no fallback: %+v", seeder.Events())
	}
	for i := 0; i < 500 && fetcher.Links(seeder.ID()) > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if err := fetcher.Connect(ctxFor(t, 20*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	l = fetcher.linksTo(seeder.ID())[0]
	if _, err := l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil); err != nil {
		t.Fatalf("request after the fallback: %v", err)
	}
}
