package ops

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Busy runs copies for about the time asked, releases its buffers, and
// stops when its context is done.
func TestBusy(t *testing.T) {
	d, k := shared.d, shared.k
	live := d.Stats().LiveBuffers
	start := time.Now()
	// Longer than one submission's copies take on lavapipe (~250 ms), so
	// that a loop that stops early shows.
	const want = 500 * time.Millisecond
	n, err := k.Busy(ctxT(t), want)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); n < busyCopies || el < want {
		t.Fatalf("%d copies in %v; want at least %d in at least %v", n, el, busyCopies, want)
	}
	if n := d.Stats().LiveBuffers; n != live {
		t.Fatalf("%d live buffers after Busy; %d before", n, live)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	if n, err := k.Busy(ctx, time.Hour); !errors.Is(err, context.Canceled) || n != 0 {
		t.Fatalf("a done context: %d copies, %v; want none and context.Canceled", n, err)
	}
}
