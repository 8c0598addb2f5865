package swarm

import (
	"errors"
	"testing"
	"time"
)

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
