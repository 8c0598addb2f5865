package p2p

import (
	"context"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

// SignalRouter is a swarm.Signaler over two paths: libp2p streams to
// peers the host is connected to, and a fallback (the signaling server's
// client) for the others and for browsers. Each connection attempt (peer
// and sid) stays on the path its first message took, so its offer,
// answer and candidates arrive in order. When the fallback's session
// ends, the router goes on over libp2p, and SetFallback gives it the
// next session: a node started with a router outlives its signaling
// sessions.
type SignalRouter struct {
	stream *StreamSignaler
	in     chan *signaling.Message
	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	fallback swarm.Signaler
	stopFB   context.CancelFunc // stops the fallback's forwarder
	live     int                // forwarders running; in closes at 0
	paths    map[pathKey]pathEntry
}

type pathKey struct {
	peer peer.ID
	sid  string
}

type pathEntry struct {
	stream bool
	at     time.Time
}

const (
	maxPaths = 4096
	// pathTTL outlives any connection setup (swarm's ConnectTimeout).
	pathTTL = 2 * time.Minute
)

// NewSignalRouter routes over stream and fallback (nil: libp2p only
// until SetFallback). It becomes the only reader of their Incoming
// channels. Close it before them; it does not close them.
func NewSignalRouter(stream *StreamSignaler, fallback swarm.Signaler) *SignalRouter {
	ctx, cancel := context.WithCancel(context.Background())
	r := &SignalRouter{
		stream: stream,
		in:     make(chan *signaling.Message, stream.cfg.Inbox),
		ctx:    ctx,
		cancel: cancel,
		paths:  make(map[pathKey]pathEntry),
	}
	r.mu.Lock()
	r.startForward(ctx, stream.Incoming(), true)
	r.mu.Unlock()
	if fallback != nil {
		r.SetFallback(fallback)
	}
	return r
}

// SetFallback replaces the fallback (nil: none), for example with the
// session that replaced one that ended. The router stops reading the old
// one. It returns ErrClosed once Incoming is closed.
func (r *SignalRouter) SetFallback(fb swarm.Signaler) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == 0 {
		return ErrClosed
	}
	if r.stopFB != nil {
		r.stopFB()
		r.stopFB = nil
	}
	r.fallback = fb
	// Attempts that were on the old fallback cannot go on over the new
	// session: forget their path so they do not hang on a dead one.
	for k, e := range r.paths {
		if !e.stream {
			delete(r.paths, k)
		}
	}
	if fb != nil {
		ctx, stop := context.WithCancel(r.ctx)
		r.stopFB = stop
		r.startForward(ctx, fb.Incoming(), false)
	}
	return nil
}

// startForward runs a forwarder from src; r.mu is held.
func (r *SignalRouter) startForward(ctx context.Context, src <-chan *signaling.Message, stream bool) {
	r.live++
	go func() {
		defer func() {
			r.mu.Lock()
			r.live--
			if r.live == 0 {
				close(r.in)
			}
			r.mu.Unlock()
		}()
		for {
			select {
			case m, ok := <-src:
				if !ok {
					return
				}
				if p, err := peer.Decode(m.From); err == nil && m.SID != "" {
					r.pathFor(pathKey{p, m.SID}, stream)
				}
				select {
				case r.in <- m:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
}

// pathFor returns the path of k, setting it to stream if it has none.
func (r *SignalRouter) pathFor(k pathKey, stream bool) bool {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.paths[k]; ok && now.Sub(e.at) < pathTTL {
		return e.stream
	}
	r.setPathLocked(k, stream, now)
	return stream
}

func (r *SignalRouter) setPathLocked(k pathKey, stream bool, now time.Time) {
	if _, ok := r.paths[k]; !ok && len(r.paths) >= maxPaths {
		for pk, e := range r.paths {
			if now.Sub(e.at) >= pathTTL {
				delete(r.paths, pk)
			}
		}
		for pk := range r.paths { // still full: any one, a bound not a policy
			if len(r.paths) < maxPaths {
				break
			}
			delete(r.paths, pk)
		}
	}
	r.paths[k] = pathEntry{stream: stream, at: now}
}

// Send relays m over libp2p if its attempt took that path or, for a new
// attempt, if the host is connected to m.To; otherwise through the
// fallback. A new attempt whose first libp2p send fails moves to the
// fallback. Safe for concurrent use.
func (r *SignalRouter) Send(ctx context.Context, m *signaling.Message) error {
	r.mu.Lock()
	fb := r.fallback
	r.mu.Unlock()
	to, err := peer.Decode(m.To)
	if err != nil || fb == nil {
		return r.stream.Send(ctx, m)
	}
	k := pathKey{to, m.SID}
	now := time.Now()
	r.mu.Lock()
	e, known := r.paths[k]
	known = known && now.Sub(e.at) < pathTTL
	if !known {
		e.stream = r.stream.Connected(to)
		r.setPathLocked(k, e.stream, now)
	}
	r.mu.Unlock()
	if !e.stream {
		return fb.Send(ctx, m)
	}
	err = r.stream.Send(ctx, m)
	if err == nil || known {
		return err
	}
	r.mu.Lock()
	r.setPathLocked(k, false, time.Now())
	r.mu.Unlock()
	return fb.Send(ctx, m)
}

// Incoming delivers the messages of both paths. It is closed by Close,
// or when every source it reads has closed.
func (r *SignalRouter) Incoming() <-chan *signaling.Message { return r.in }

// Close stops forwarding; the signalers it routes over stay open.
func (r *SignalRouter) Close() error {
	r.cancel()
	return nil
}
