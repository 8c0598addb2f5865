package swarm

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// sendSlice sends bytes [from, to) of slice as PIECEs of request req of at
// most size bytes each.
func sendSlice(l *link, ch *channel, req uint32, slice []byte, from, to, size int) error {
	for pos := from; pos < to; {
		k := min(size, to-pos)
		if err := ch.write(l.ctx, wire.AppendPiece(nil, req, uint32(pos), slice[pos:pos+k])); err != nil {
			return err
		}
		pos += k
	}
	return nil
}

// dishonest returns a seeder whose serve worker is serve (called with the
// job's honest slice and the number of jobs served before), a fetcher
// with one bulk channel (so that answers follow each other on it) and the
// fetcher's link to the seeder, and a blob the seeder holds.
func dishonest(t *testing.T, fetcherTimeout time.Duration, serve func(l *link, ch *channel, job serveJob, slice []byte, nth int) error) (*testNode, *testNode, *link, cas.Info) {
	t.Helper()
	url := startSignal(t)
	var (
		mu   sync.Mutex
		jobs int
	)
	var seeder *testNode
	seeder = newTestNode(t, url, func(c *Config) {
		c.testHooks.serve = func(l *link, ch *channel, job serveJob) error {
			slice, err := seeder.st.AppendSlice(nil, job.cid, job.off, job.n)
			if err != nil {
				return err
			}
			mu.Lock()
			nth := jobs
			jobs++
			mu.Unlock()
			return serve(l, ch, job, slice, nth)
		}
	})
	fetcher := newTestNode(t, url, func(c *Config) {
		c.Links, c.BulkChannels = 1, 1
		c.RequestTimeout = fetcherTimeout
	})
	inf := put(t, seeder.st, randBytes(11, 1<<20))
	if err := fetcher.Connect(ctxFor(t, 20*time.Second), seeder.ID()); err != nil {
		t.Fatal(err)
	}
	return seeder, fetcher, fetcher.linksTo(seeder.ID())[0], inf
}

// A PIECE stream that is not the requested slice is a protocol error that
// the request returns (ErrProtocol) and that closes the link; the seeder's
// misbehaviour is counted.
func TestPieceStreamViolations(t *testing.T) {
	cases := []struct {
		name   string
		serve  func(l *link, ch *channel, job serveJob, slice []byte, nth int) error
		reason string
	}{
		{"slice 100 bytes short, next answer follows", func(l *link, ch *channel, job serveJob, slice []byte, nth int) error {
			if nth == 0 {
				return sendSlice(l, ch, job.req, slice, 0, len(slice)-100, wire.MaxPieceData)
			}
			return sendSlice(l, ch, job.req, slice, 0, len(slice), wire.MaxPieceData)
		}, "ended after"},
		{"1-byte pieces", func(l *link, ch *channel, job serveJob, slice []byte, _ int) error {
			return sendSlice(l, ch, job.req, slice, 0, len(slice), 1)
		}, "at least 1024"},
		{"more than the slice", func(l *link, ch *channel, job serveJob, slice []byte, _ int) error {
			return sendSlice(l, ch, job.req, append(slice, make([]byte, 2000)...), 0, len(slice)+2000, 2000)
		}, "expected offset"},
		{"gap", func(l *link, ch *channel, job serveJob, slice []byte, _ int) error {
			return sendSlice(l, ch, job.req, slice, 4096, len(slice), wire.MaxPieceData)
		}, "expected offset"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seeder, fetcher, l, inf := dishonest(t, 20*time.Second, tc.serve)
			errs := make(chan error, 2)
			for range 2 {
				go func() {
					_, err := l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil)
					errs <- err
				}()
			}
			err := <-errs
			var pe *ProtocolError
			if !errors.As(err, &pe) || !errors.Is(err, ErrProtocol) || !strings.Contains(pe.Reason, tc.reason) {
				t.Fatalf("request: %v; want a *ProtocolError (ErrProtocol) containing %q", err, tc.reason)
			}
			<-errs
			select {
			case <-l.done:
			case <-time.After(10 * time.Second):
				t.Fatal("link not closed")
			}
			if !hasEvent(fetcher.Node, EventProtocol, seeder.ID(), tc.reason) {
				t.Fatalf("no protocol event for the seeder: %+v", fetcher.Events())
			}
		})
	}
}

func hasEvent(n *Node, kind string, p interface{ String() string }, detail string) bool {
	for _, e := range n.Events() {
		if e.Kind == kind && e.Peer.String() == p.String() && strings.Contains(e.Detail, detail) {
			return true
		}
	}
	return false
}

// PIECEs for a request already answered are bounded: a flood closes the
// link.
func TestStalePieceFlood(t *testing.T) {
	_, _, l, inf := dishonest(t, 20*time.Second, func(l *link, ch *channel, job serveJob, slice []byte, _ int) error {
		if err := sendSlice(l, ch, job.req, slice, 0, len(slice), wire.MaxPieceData); err != nil {
			return err
		}
		for range 2 * maxStale {
			if err := sendSlice(l, ch, job.req, slice, 0, wire.MinPieceData, wire.MinPieceData); err != nil {
				return nil // the fetcher closed the link: what this test wants
			}
		}
		return nil
	})
	if _, err := l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil); err != nil {
		t.Fatalf("request: %v", err)
	}
	select {
	case <-l.done:
	case <-time.After(20 * time.Second):
		t.Fatal("link not closed by a flood of stale PIECEs")
	}
	if err := l.errClosed(); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "already answered") {
		t.Fatalf("link closed with %v; want a protocol error about stale frames", err)
	}
}

// A slice that stops short times out with what arrived (so the fetcher can
// count it against the peer), and the link stays; an answer that comes
// after the request was abandoned is dropped, not held against the peer.
func TestStalledAndLateAnswers(t *testing.T) {
	seeder, fetcher, l, inf := dishonest(t, 3*time.Second, func(l *link, ch *channel, job serveJob, slice []byte, nth int) error {
		switch nth {
		case 0: // half, then nothing
			return sendSlice(l, ch, job.req, slice, 0, len(slice)/2, wire.MaxPieceData)
		case 1: // all of it, once the fetcher gave up
			for i := 0; i < 1000 && !l.cancelled(job.req); i++ {
				time.Sleep(10 * time.Millisecond)
			}
			return sendSlice(l, ch, job.req, slice, 0, len(slice), wire.MaxPieceData)
		}
		return sendSlice(l, ch, job.req, slice, 0, len(slice), wire.MaxPieceData)
	})
	want := int(cas.SliceLen(inf.Size, 0, inf.Size))
	for i := range 2 {
		_, err := l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil)
		var te *RequestTimeoutError
		if !errors.As(err, &te) || !errors.Is(err, ErrRequestTimeout) || te.Want != want || te.Peer != seeder.ID() {
			t.Fatalf("request %d: %v; want a *RequestTimeoutError for %d bytes", i, err, want)
		}
		if i == 0 && te.Got != want/2 {
			t.Fatalf("stalled request: got %d bytes; want %d", te.Got, want/2)
		}
	}
	// The late answer to the second is dropped; the third is served (tried
	// again if this machine is too slow for the short timeout).
	var slice []byte
	var err error
	for range 5 {
		if slice, err = l.request(ctxFor(t, 30*time.Second), inf.CID, inf.Size, 0, inf.Size, nil); !errors.Is(err, ErrRequestTimeout) {
			break
		}
	}
	if err != nil || len(slice) != want {
		t.Fatalf("third request: %d bytes, %v", len(slice), err)
	}
	if l.isClosed() || hasEvent(fetcher.Node, EventProtocol, seeder.ID(), "") {
		t.Fatalf("late answers were held against the seeder: %v %+v", l.errClosed(), fetcher.Events())
	}
}

// Protocol violations are counted per peer: the third bans it.
func TestProtocolViolationsBan(t *testing.T) {
	url := startSignal(t)
	a := newTestNode(t, url, nil)
	b := newTestNode(t, url, func(c *Config) { c.Links = maxStrikes })
	if err := b.Connect(ctxFor(t, 20*time.Second), a.ID()); err != nil {
		t.Fatal(err)
	}
	for i, l := range b.linksTo(a.ID()) {
		if a.Banned(b.ID()) {
			t.Fatalf("banned after %d violations", i)
		}
		if err := l.ctl.write(ctxFor(t, 5*time.Second), []byte{0, 0, 0, 1, 99}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-l.done:
		case <-time.After(10 * time.Second):
			t.Fatal("link not closed")
		}
		for j := 0; j < 200 && !hasEvent(a.Node, EventProtocol, b.ID(), "unknown frame type") && i == 0; j++ {
			time.Sleep(10 * time.Millisecond)
		}
	}
	for j := 0; j < 500 && !a.Banned(b.ID()); j++ {
		time.Sleep(10 * time.Millisecond)
	}
	if !a.Banned(b.ID()) {
		t.Fatalf("not banned after %d violations: %+v", maxStrikes, a.Events())
	}
}
