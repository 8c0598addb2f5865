package swarm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/signaling"
)

// StartOptions configure Start: the node's Config, where to sign in and
// which topics to join.
type StartOptions struct {
	Config
	// SignalURL is the signaling server (ws://host:port/v1). Required.
	SignalURL string
	// Topics are joined after each sign-in (at least one).
	Topics []string
	// MaxBackoff bounds the wait between reconnection attempts (default 30 s).
	MaxBackoff time.Duration
	// Persist keeps trying when the first sign-in fails too (a daemon
	// started before its signaling server); Start then returns at once.
	Persist bool
	// Once signs in once and keeps that node until Close, even if the
	// signaling session ends (its links stay up): for one-off work, a
	// fetch, that must not lose its node to a reconnection.
	Once bool
}

// Member is a node kept in the swarm: it signs in, joins its topics, and
// when the signaling session drops it makes a new node and signs in
// again, backing off up to MaxBackoff, until Close. A program that embeds
// the swarm needs only Start, Node and Discover.
type Member struct {
	opt    StartOptions
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	node  *Node
	sig   *signaling.Client
	ready chan struct{} // closed at the first sign-in
	err   error         // why the first sign-in failed, if it did
}

// Start signs a node in to the swarm and keeps it there. It returns once
// the first sign-in succeeded, or with the error that made it fail (a bad
// URL, a refused identity) or ctx's.
func Start(ctx context.Context, opt StartOptions) (*Member, error) {
	if opt.SignalURL == "" || len(opt.Topics) == 0 {
		return nil, errors.New("swarm: Start needs a signaling URL and a topic")
	}
	if opt.MaxBackoff <= 0 {
		opt.MaxBackoff = 30 * time.Second
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m := &Member{opt: opt, cancel: cancel, done: make(chan struct{}), ready: make(chan struct{})}
	go m.run(runCtx)
	if opt.Persist {
		return m, nil
	}
	select {
	case <-m.ready:
	case <-ctx.Done():
		m.Close()
		return nil, ctx.Err()
	}
	m.mu.Lock()
	err := m.err
	m.mu.Unlock()
	if err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Node returns the node of the moment (nil while reconnecting).
func (m *Member) Node() *Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.node
}

// Discover returns the members of the topics (for FetchOptions.Discover
// and Ranges.Discover).
func (m *Member) Discover(ctx context.Context) ([]peer.ID, error) {
	m.mu.Lock()
	sc := m.sig
	m.mu.Unlock()
	if sc == nil {
		return nil, errors.New("swarm: not signed in (reconnecting)")
	}
	var all []peer.ID
	for _, t := range m.opt.Topics {
		ps, err := sc.Peers(ctx, t)
		if err != nil {
			return all, err
		}
		all = append(all, ps...)
	}
	return all, nil
}

// Close leaves the swarm: the node's links are closed (peers are told it
// is going away) and the signaling session ends.
func (m *Member) Close() error {
	m.cancel()
	<-m.done
	return nil
}

func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	first := true
	backoff := time.Second
	for ctx.Err() == nil {
		n, sc, err := m.join(ctx)
		if err == nil {
			m.mu.Lock()
			m.node, m.sig = n, sc // before ready: Start's caller reads Node at once
			m.mu.Unlock()
		}
		if first {
			first = false
			m.mu.Lock()
			m.err = err
			m.mu.Unlock()
			close(m.ready)
			if err != nil && !m.opt.Persist {
				return
			}
		}
		if err == nil {
			backoff = time.Second
			m.opt.Logger.Info("swarm: joined", "peer", n.ID(), "signal", m.opt.SignalURL, "topics", m.opt.Topics)
			select {
			case <-ctx.Done():
			case <-sc.Done():
				if m.opt.Once {
					<-ctx.Done() // keep the node: its links may still carry the work
					break
				}
				m.opt.Logger.Warn("swarm: signaling session ended; reconnecting", "err", sc.Err())
			}
			m.mu.Lock()
			m.node, m.sig = nil, nil
			m.mu.Unlock()
			n.Close()
			sc.Close()
			continue
		}
		if ctx.Err() != nil {
			return
		}
		m.opt.Logger.Warn("swarm: cannot join; retrying", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, m.opt.MaxBackoff)
	}
}

// join makes a node, signs it in and joins the topics.
func (m *Member) join(ctx context.Context) (*Node, *signaling.Client, error) {
	n, err := NewNode(m.opt.Config)
	if err != nil {
		return nil, nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sc, err := signaling.Dial(dctx, m.opt.SignalURL, signaling.ClientConfig{Key: m.opt.Identity.Key, Logger: m.opt.Logger})
	if err != nil {
		n.Close()
		return nil, nil, err
	}
	if err := n.Start(sc); err != nil {
		n.Close()
		sc.Close()
		return nil, nil, err
	}
	for _, t := range m.opt.Topics {
		if _, err := sc.Join(dctx, t); err != nil {
			n.Close()
			sc.Close()
			return nil, nil, fmt.Errorf("join %s: %w", t, err)
		}
	}
	return n, sc, nil
}
