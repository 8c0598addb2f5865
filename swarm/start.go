package swarm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
)

// StartOptions configure Start: the node's Config, where to sign in and
// which topics to join.
type StartOptions struct {
	Config
	// SignalURL is the signaling server (ws://host:port/v1). Required
	// unless Overlay is set.
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

	// Overlay, if set, is a second network between native peers
	// (swarm/p2p). The member then keeps one node for its whole life,
	// whose signaling goes over the overlay where it can and through the
	// session of the moment otherwise, so that losing the signaling
	// server loses neither the node nor the peers met; it announces what
	// Announce lists, and Discover and Providers ask the overlay too.
	// A first sign-in that fails is then not fatal if the overlay has
	// peers (it bootstrapped from configured addresses). Close closes
	// the node, not the overlay.
	Overlay Overlay
	// Announce lists the blobs to provide on the overlay (everything the
	// node serves); called every AnnounceEvery (default 1 min), new ones
	// are provided (the overlay re-provides them on its own timer).
	Announce      func(ctx context.Context) ([]cas.CID, error)
	AnnounceEvery time.Duration
	// MeetPeers is how many members of the topics, not yet reached over
	// the overlay, are met after each sign-in (default 4): one link each,
	// whose offer and answer carry both sides' overlay addresses.
	MeetPeers int
}

// Member is a node kept in the swarm: it signs in, joins its topics, and
// when the signaling session drops it makes a new node and signs in
// again, backing off up to MaxBackoff, until Close. A program that embeds
// the swarm needs only Start, Node and Discover.
type Member struct {
	opt    StartOptions
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup // announce loop, meetings

	mu    sync.Mutex
	node  *Node
	sig   *signaling.Client
	ready chan struct{} // closed at the first sign-in
	err   error         // why the first sign-in failed, if it did

	// fixed is the node of a member with an overlay, for its whole life.
	fixed     *Node
	announced map[cas.Digest]bool // provided on the overlay
	kick      chan struct{}       // AnnounceSoon's signal to the announce loop
	// gossiped: announced on gossip (AnnounceHave) while not yet
	// provided; providing: a round of provides runs (in the background:
	// what is stored meanwhile is gossiped at once, not after it).
	gossiped  map[cas.Digest]bool
	providing bool
}

// Start signs a node in to the swarm and keeps it there. It returns once
// the first sign-in succeeded, or with the error that made it fail (a bad
// URL, a refused identity) or ctx's. With an Overlay that has peers, a
// failed first sign-in is logged and retried (unless Once), not returned.
func Start(ctx context.Context, opt StartOptions) (*Member, error) {
	if opt.SignalURL == "" && opt.Overlay == nil || len(opt.Topics) == 0 {
		return nil, errors.New("swarm: Start needs a signaling URL (or an overlay) and a topic")
	}
	if opt.MaxBackoff <= 0 {
		opt.MaxBackoff = 30 * time.Second
	}
	if opt.AnnounceEvery <= 0 {
		opt.AnnounceEvery = time.Minute
	}
	if opt.MeetPeers <= 0 {
		opt.MeetPeers = 4
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m := &Member{opt: opt, cancel: cancel, done: make(chan struct{}), ready: make(chan struct{}), announced: make(map[cas.Digest]bool), gossiped: make(map[cas.Digest]bool), kick: make(chan struct{}, 1)}
	if ov := opt.Overlay; ov != nil {
		cfg := opt.Config
		if cfg.AnnounceAddrs == nil {
			cfg.AnnounceAddrs = ov.Addrs
		}
		if cfg.OnPeerAddrs == nil {
			cfg.OnPeerAddrs = ov.Meet
		}
		n, err := NewNode(cfg)
		if err != nil {
			cancel()
			return nil, err
		}
		if err := n.Start(ov.Signaler()); err != nil {
			n.Close()
			cancel()
			return nil, err
		}
		m.fixed, m.node = n, n
		if opt.Announce != nil {
			m.wg.Add(1)
			go m.announceLoop(runCtx)
		}
	}
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
		if m.fixed != nil && len(opt.Overlay.Peers()) > 0 {
			opt.Logger.Warn("swarm: no signaling server; going on over the overlay", "err", err, "overlay_peers", len(opt.Overlay.Peers()))
			return m, nil
		}
		m.Close()
		return nil, err
	}
	return m, nil
}

// Node returns the node of the moment (nil while reconnecting; never nil
// with an Overlay).
func (m *Member) Node() *Node {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.node
}

// Online reports whether the member is signed in to the signaling server
// now.
func (m *Member) Online() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sig != nil
}

// Overlay returns the member's overlay (nil if none).
func (m *Member) Overlay() Overlay { return m.opt.Overlay }

// Discover returns the members of the topics (for FetchOptions.Discover
// and Ranges.Discover) and, with an overlay, the peers it is connected
// to. It fails only if it has nobody to return and the signaling server
// could not be asked.
func (m *Member) Discover(ctx context.Context) ([]peer.ID, error) {
	m.mu.Lock()
	sc := m.sig
	m.mu.Unlock()
	var all []peer.ID
	var err error
	if sc == nil {
		err = errors.New("swarm: not signed in (reconnecting)")
	}
	for _, t := range m.opt.Topics {
		if sc == nil {
			break
		}
		ps, e := sc.Peers(ctx, t)
		if e != nil {
			err = e
			break
		}
		all = append(all, ps...)
	}
	if ov := m.opt.Overlay; ov != nil {
		all = append(all, ov.Peers()...)
		if len(all) > 0 {
			err = nil
		}
	}
	return all, err
}

// maxProviders bounds the providers one lookup returns.
const maxProviders = 16

// Providers returns peers that announced c on the overlay (none without
// one), for FetchOptions.Providers.
func (m *Member) Providers(ctx context.Context, c cas.CID) ([]peer.ID, error) {
	if m.opt.Overlay == nil {
		return nil, nil
	}
	return m.opt.Overlay.Providers(ctx, c, maxProviders)
}

// Close leaves the swarm: the node's links are closed (peers are told it
// is going away) and the signaling session ends.
func (m *Member) Close() error {
	m.cancel()
	<-m.done
	m.wg.Wait()
	if m.fixed != nil {
		m.fixed.Close()
	}
	return nil
}

func (m *Member) run(ctx context.Context) {
	defer close(m.done)
	if m.opt.SignalURL == "" { // an overlay only: nothing to sign in to
		close(m.ready)
		<-ctx.Done()
		return
	}
	first := true
	backoff := time.Second
	ov := m.opt.Overlay
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
			if err != nil && !m.opt.Persist && (ov == nil || m.opt.Once) {
				return
			}
		}
		if err == nil {
			backoff = time.Second
			m.opt.Logger.Info("swarm: joined", "peer", n.ID(), "signal", m.opt.SignalURL, "topics", m.opt.Topics)
			if ov != nil {
				m.meet(ctx, sc)
			}
			once := false
			select {
			case <-ctx.Done():
			case <-sc.Done():
				if m.opt.Once {
					once = true
					break
				}
				m.opt.Logger.Warn("swarm: signaling session ended; reconnecting", "err", sc.Err())
			}
			m.mu.Lock()
			if m.fixed == nil {
				m.node = nil
			}
			m.sig = nil
			m.mu.Unlock()
			if ov != nil {
				ov.SetSession(nil)
			}
			if once {
				<-ctx.Done() // keep the node: its links may still carry the work
			}
			if m.fixed == nil {
				n.Close()
			}
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

// join signs in and joins the topics: with a new node, or with the
// member's only node when it has an overlay.
func (m *Member) join(ctx context.Context) (*Node, *signaling.Client, error) {
	if m.opt.SignalURL == "" {
		return nil, nil, errors.New("swarm: no signaling server")
	}
	n := m.fixed
	if n == nil {
		var err error
		if n, err = NewNode(m.opt.Config); err != nil {
			return nil, nil, err
		}
	}
	fail := func(err error) (*Node, *signaling.Client, error) {
		if m.fixed == nil {
			n.Close()
		}
		return nil, nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sc, err := signaling.Dial(dctx, m.opt.SignalURL, signaling.ClientConfig{Key: m.opt.Identity.Key, Logger: m.opt.Logger})
	if err != nil {
		return fail(err)
	}
	if m.fixed != nil {
		m.opt.Overlay.SetSession(sc)
	} else if err := n.Start(sc); err != nil {
		sc.Close()
		return fail(err)
	}
	for _, t := range m.opt.Topics {
		if _, err := sc.Join(dctx, t); err != nil {
			if m.fixed != nil {
				m.opt.Overlay.SetSession(nil)
			}
			sc.Close()
			return fail(fmt.Errorf("join %s: %w", t, err))
		}
	}
	return n, sc, nil
}

// meet opens one link to each of up to MeetPeers members of the topics
// that the overlay does not reach yet, in the background: the offer and
// answer carry both sides' overlay addresses, so each joins the other's
// overlay (and through it the routing table).
func (m *Member) meet(ctx context.Context, sc *signaling.Client) {
	ov := m.opt.Overlay
	reached := map[peer.ID]bool{m.opt.Identity.ID: true}
	for _, p := range ov.Peers() {
		reached[p] = true
	}
	var cands []peer.ID
	for _, t := range m.opt.Topics {
		ps, err := sc.Peers(ctx, t)
		if err != nil {
			return
		}
		for _, p := range ps {
			if !reached[p] {
				reached[p] = true
				cands = append(cands, p)
			}
		}
	}
	rand.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	cands = cands[:min(len(cands), m.opt.MeetPeers)]
	for _, p := range cands {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if _, err := m.fixed.connectN(ctx, p, 1); err != nil {
				m.opt.Logger.Debug("swarm: meet", "peer", p, "err", err)
			}
		}()
	}
}

// announceLoop provides on the overlay, every AnnounceEvery, what
// Announce lists and was not provided yet.
func (m *Member) announceLoop(ctx context.Context) {
	defer m.wg.Done()
	t := time.NewTicker(m.opt.AnnounceEvery)
	defer t.Stop()
	for {
		m.announce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.kick:
		}
	}
}

// AnnounceSoon makes the announce loop run now rather than at its next
// tick, for example after a fetch stored new blobs. It does not block.
func (m *Member) AnnounceSoon() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// announceConcurrency bounds the provide calls in flight.
const announceConcurrency = 8

func (m *Member) announce(ctx context.Context) {
	ov := m.opt.Overlay
	if len(ov.Peers()) == 0 {
		return // nobody to store the records: the next round will
	}
	cids, err := m.opt.Announce(ctx)
	if err != nil {
		m.opt.Logger.Warn("swarm: listing what to announce", "err", err)
		return
	}
	listed := make(map[cas.Digest]bool, len(cids))
	var todo, fresh []cas.CID
	m.mu.Lock()
	for _, c := range cids {
		listed[c.Digest()] = true
		if !m.announced[c.Digest()] {
			todo = append(todo, c)
			if !m.gossiped[c.Digest()] {
				m.gossiped[c.Digest()] = true
				fresh = append(fresh, c)
			}
		}
	}
	for d := range m.announced { // gone from the store: forget them
		if !listed[d] {
			delete(m.announced, d)
		}
	}
	for d := range m.gossiped {
		if !listed[d] || m.announced[d] {
			delete(m.gossiped, d)
		}
	}
	busy := m.providing
	if !busy && len(todo) > 0 {
		m.providing = true
	}
	m.mu.Unlock()
	// Say it on gossip at once; the DHT records take longer (a walk of
	// the DHT, and its timeouts when peers died).
	if ha, ok := ov.(haveAnnouncer); ok {
		for _, c := range fresh {
			ha.AnnounceHave(c)
		}
	}
	if busy || len(todo) == 0 {
		return // the round of provides running goes on; the next takes the rest
	}
	m.wg.Add(1) // the announce loop holds one: Close waits for both
	go func() {
		defer m.wg.Done()
		defer func() {
			m.mu.Lock()
			m.providing = false
			m.mu.Unlock()
		}()
		sem := make(chan struct{}, announceConcurrency)
		var wg sync.WaitGroup
		defer wg.Wait()
		for _, c := range todo {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := ov.Provide(ctx, c); err != nil {
					m.opt.Logger.Debug("swarm: provide", "cid", c, "err", err)
					return
				}
				m.mu.Lock()
				m.announced[c.Digest()] = true
				m.mu.Unlock()
			}()
		}
	}()
}

// Announced returns how many blobs the member has provided on the overlay.
func (m *Member) Announced() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.announced)
}
