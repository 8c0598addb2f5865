package p2p

import (
	"context"
	"errors"
	"fmt"
	manet "github.com/multiformats/go-multiaddr/net"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
)

// OverlayConfig configures an Overlay: its host, DHT, gossip and
// signaling. Identity is required; zero values take the documented
// defaults.
type OverlayConfig struct {
	Identity *swarm.Identity
	// Loopback keeps the host on 127.0.0.1 (HostConfig.Loopback).
	Loopback bool
	// ListenAddrs (HostConfig.ListenAddrs).
	ListenAddrs []string
	// Bootstrap are multiaddrs ending in /p2p/<id> of peers to join
	// through; tried at start and again while the overlay has no peer.
	Bootstrap []string
	// SwarmName names the have-announcement topic (default "rdrr").
	SwarmName string
	// DHTAuto answers DHT queries only when libp2p finds the host
	// publicly reachable. Default: always answer, since in a small swarm,
	// on a LAN or on loopback nobody has a public address and under
	// DHTAuto nobody would answer.
	DHTAuto bool
	// ReprovideInterval (DHTConfig; default 12 h).
	ReprovideInterval time.Duration
	// FindTimeout bounds one provider lookup (default 10 s).
	FindTimeout time.Duration
	// Registerer, if set, receives the DHT's and gossip's metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// RefusePeer, if set, says which peers the host refuses to connect
	// to or accept (the connection gater): those the swarm node banned.
	// Safe for concurrent use; called on libp2p's goroutines.
	RefusePeer func(peer.ID) bool
	// HaveRefresh is how often every blob provided is announced again on
	// gossip, for peers that joined since (default 10 min).
	HaveRefresh time.Duration
}

// Bounds of an Overlay.
const (
	// maxMeetings bounds the connections Meet makes at once; more are
	// dropped (the peer is met again at its next offer).
	maxMeetings = 8
	// maxOverlayPeers bounds what Peers returns.
	maxOverlayPeers = 256
	// maxHaveDigests and maxHavePeers bound the have-announcements kept
	// (blobs, and peers per blob).
	maxHaveDigests = 1 << 16
	maxHavePeers   = 8
	// maxHaveQueue bounds the CIDs waiting to be announced on gossip.
	maxHaveQueue = 4 * MaxHaveCIDs
	// addrTTL is how long addresses learned from a peer are kept.
	addrTTL = 30 * time.Minute
)

// Overlay is a native peer's libp2p presence as the swarm uses it: a
// host, the DHT, the have topic, and signaling over streams routed with
// a signaling server's session as fallback. It implements
// swarm.Overlay. Close it after the nodes that use it.
type Overlay struct {
	Host   *Host
	DHT    *DHT
	Gossip *Gossip
	Haves  *Haves
	Signal *StreamSignaler
	Router *SignalRouter

	cfg      OverlayConfig
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	meetings chan struct{} // semaphore of Meet's connections

	repl        *Topic      // the replication topic
	replication replication // what it said
	live        liveness    // pings shared by Alive's callers
	lookups     lookups     // LiveProviders' recent DHT lookups

	mu       sync.Mutex
	haves    map[cas.Digest][]peer.ID // from have-announcements
	queue    []cas.CID                // to announce on gossip
	provided map[cas.Digest]cas.CID   // announced once: again every HaveRefresh
}

var _ swarm.Overlay = (*Overlay)(nil)

// NewOverlay starts a host and its DHT, gossip and signaling, and
// connects to the bootstrap peers (a failure is logged: peers met later
// will do).
func NewOverlay(ctx context.Context, cfg OverlayConfig) (*Overlay, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SwarmName == "" {
		cfg.SwarmName = "rdrr"
	}
	if cfg.FindTimeout <= 0 {
		cfg.FindTimeout = 10 * time.Second
	}
	mode := DHTServer
	if cfg.DHTAuto {
		mode = DHTAuto
	}
	if cfg.HaveRefresh <= 0 {
		cfg.HaveRefresh = 10 * time.Minute
	}
	var gater *Gater
	if cfg.Loopback || cfg.RefusePeer != nil {
		gater = &Gater{RefusePeer: cfg.RefusePeer}
		if cfg.Loopback {
			gater.AllowAddr = manet.IsIPLoopback
		}
	}
	hc := HostConfig{Identity: cfg.Identity, Loopback: cfg.Loopback, ListenAddrs: cfg.ListenAddrs, Logger: cfg.Logger}
	if gater != nil {
		hc.Gater = gater
	}
	h, err := NewHost(hc)
	if err != nil {
		return nil, err
	}
	o := &Overlay{Host: h, cfg: cfg, log: cfg.Logger, meetings: make(chan struct{}, maxMeetings), haves: make(map[cas.Digest][]peer.ID),
		replication: replication{targets: map[cas.Digest]swarm.ReplicaTarget{}, replicators: map[peer.ID]time.Time{}},
		provided:    map[cas.Digest]cas.CID{}}
	fail := func(err error) (*Overlay, error) {
		o.closeParts()
		return nil, err
	}
	if o.DHT, err = NewDHT(ctx, h, DHTConfig{Mode: mode, Bootstrap: cfg.Bootstrap, ReprovideInterval: cfg.ReprovideInterval,
		FindTimeout: cfg.FindTimeout, Registerer: cfg.Registerer, Logger: cfg.Logger}); err != nil {
		return fail(err)
	}
	if o.Gossip, err = NewGossip(h, GossipConfig{Registerer: cfg.Registerer, Logger: cfg.Logger}); err != nil {
		return fail(err)
	}
	if o.Haves, err = o.Gossip.JoinHaves(cfg.SwarmName); err != nil {
		return fail(err)
	}
	replName, err := ReplicateTopic(cfg.SwarmName)
	if err != nil {
		return fail(err)
	}
	if o.repl, err = o.Gossip.JoinValidatedTopic(replName, MaxReplicateBytes, validReplicate); err != nil {
		return fail(err)
	}
	o.Signal = NewStreamSignaler(h, SignalConfig{Logger: cfg.Logger})
	o.Router = NewSignalRouter(o.Signal, nil)
	o.ctx, o.cancel = context.WithCancel(context.Background())
	o.bootstrap(ctx)
	o.wg.Add(4)
	go o.keepBootstrapped()
	go o.readHaves()
	go o.announceHaves()
	go o.readReplicate()
	return o, nil
}

// bootstrap connects to the configured peers, if any.
func (o *Overlay) bootstrap(ctx context.Context) {
	if len(o.cfg.Bootstrap) == 0 {
		return
	}
	bctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := o.DHT.Bootstrap(bctx, nil); err != nil {
		o.log.Warn("p2p: bootstrap", "err", err)
	}
}

// keepBootstrapped bootstraps again while the host has no connection.
func (o *Overlay) keepBootstrapped() {
	defer o.wg.Done()
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		}
		if len(o.Host.Network().Peers()) == 0 {
			o.bootstrap(o.ctx)
		}
	}
}

// readHaves keeps, bounded, who announced what on the have topic.
func (o *Overlay) readHaves() {
	defer o.wg.Done()
	for {
		from, a, err := o.Haves.NextHave(o.ctx)
		if err != nil {
			if o.ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			continue
		}
		o.mu.Lock()
		for _, c := range a.CIDs {
			d := c.Digest()
			ps, ok := o.haves[d]
			if !ok && len(o.haves) >= maxHaveDigests {
				for k := range o.haves { // any one: a bound, not a policy
					delete(o.haves, k)
					break
				}
			}
			if !containsPeer(ps, from) {
				if len(ps) >= maxHavePeers {
					ps = ps[1:]
				}
				o.haves[d] = append(ps, from)
			}
		}
		o.mu.Unlock()
	}
}

func containsPeer(ps []peer.ID, p peer.ID) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

// announceHaves publishes the queued CIDs on the have topic, once a
// second at most, and every HaveRefresh all those provided so far (a
// have-announcement reaches the peers subscribed when it is sent; those
// that join later would otherwise learn only from the DHT).
func (o *Overlay) announceHaves() {
	defer o.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	refresh := time.NewTicker(o.cfg.HaveRefresh)
	defer refresh.Stop()
	for {
		var all bool
		select {
		case <-o.ctx.Done():
			return
		case <-t.C:
		case <-refresh.C:
			all = true
		}
		o.mu.Lock()
		q := o.queue
		o.queue = nil
		if all {
			q = q[:0]
			for _, c := range o.provided {
				q = append(q, c)
			}
		}
		o.mu.Unlock()
		if len(q) == 0 {
			continue
		}
		if err := o.Haves.Announce(o.ctx, q); err != nil {
			o.log.Debug("p2p: have-announcement", "err", err)
		}
	}
}

// Signaler implements swarm.Overlay.
func (o *Overlay) Signaler() swarm.Signaler { return o.Router }

// SetSession implements swarm.Overlay.
func (o *Overlay) SetSession(s swarm.Signaler) { o.Router.SetFallback(s) }

// Addrs implements swarm.Overlay: the host's listen addresses.
func (o *Overlay) Addrs() []string {
	as := o.Host.Addrs()
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// P2PAddrs returns the host's addresses with its /p2p/ part, what another
// peer's Bootstrap takes.
func (o *Overlay) P2PAddrs() []string {
	out := o.Addrs()
	for i := range out {
		out[i] += "/p2p/" + o.Host.ID().String()
	}
	return out
}

// Meet implements swarm.Overlay: it keeps p's addresses (those that
// parse, at most 8) and connects to p in the background unless already
// connected or maxMeetings connections are being made.
func (o *Overlay) Meet(p peer.ID, addrs []string) {
	if p == o.Host.ID() || o.ctx.Err() != nil {
		return
	}
	var mas []ma.Multiaddr
	for _, s := range addrs[:min(len(addrs), 8)] {
		if a, err := ma.NewMultiaddr(s); err == nil {
			if _, id := peer.SplitAddr(a); id == "" || id == p {
				mas = append(mas, a)
			}
		}
	}
	if len(mas) == 0 {
		return
	}
	o.Host.Peerstore().AddAddrs(p, mas, addrTTL)
	if o.Host.Network().Connectedness(p) == network.Connected {
		return
	}
	select {
	case o.meetings <- struct{}{}:
	default:
		return
	}
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		defer func() { <-o.meetings }()
		ctx, cancel := context.WithTimeout(o.ctx, 10*time.Second)
		defer cancel()
		if err := o.Host.Connect(ctx, peer.AddrInfo{ID: p}); err != nil {
			o.log.Debug("p2p: meet", "peer", p, "err", err)
		}
	}()
}

// Peers implements swarm.Overlay: connected peers, at most 256, at random.
func (o *Overlay) Peers() []peer.ID {
	ps := o.Host.Network().Peers()
	rand.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
	return ps[:min(len(ps), maxOverlayPeers)]
}

// Provide implements swarm.Overlay: a DHT provider record (re-provided
// on the DHT's timer) and a have-announcement on gossip.
func (o *Overlay) Provide(ctx context.Context, c cas.CID) error {
	o.mu.Lock()
	o.queueHaveLocked(c)
	if _, ok := o.provided[c.Digest()]; ok || len(o.provided) < maxHaveDigests {
		o.provided[c.Digest()] = c
	}
	o.mu.Unlock()
	return o.DHT.Provide(ctx, c)
}

// AnnounceHave queues c for the next have-announcement on gossip (within
// a second) without waiting for Provide's DHT records, which take a walk
// of the DHT (and its timeouts, when peers died): a peer that completed a
// blob is counted as a copy at once.
func (o *Overlay) AnnounceHave(c cas.CID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.queueHaveLocked(c)
}

// queueHaveLocked queues c for gossip unless it is queued. o.mu must be
// held.
func (o *Overlay) queueHaveLocked(c cas.CID) {
	if len(o.queue) >= maxHaveQueue || slices.ContainsFunc(o.queue, func(q cas.CID) bool { return q.Digest() == c.Digest() }) {
		return
	}
	o.queue = append(o.queue, c)
}

// Providers implements swarm.Overlay, for a fetch: peers that announced c
// on gossip, then on the DHT (a lookup that ends soon after it found one:
// FindFirstProviders), each connected to (at most 5 s, all at once) so
// that signaling to it can go over libp2p. It returns when every connect
// ended or one succeeded; the others go on meanwhile.
func (o *Overlay) Providers(ctx context.Context, c cas.CID, limit int) ([]peer.ID, error) {
	return o.providers(ctx, c, limit, true)
}

// providers is Providers; first: the fetch's kind of lookup, and the
// return at the first connect.
func (o *Overlay) providers(ctx context.Context, c cas.CID, limit int, first bool) ([]peer.ID, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("p2p: Providers: limit must be positive")
	}
	o.mu.Lock()
	out := append([]peer.ID(nil), o.haves[c.Digest()]...)
	o.mu.Unlock()
	out = out[:min(len(out), limit)]
	var infos []peer.AddrInfo
	var err error
	if len(out) < limit {
		o.awaitRoutingTable(ctx)
		if first {
			infos, err = o.DHT.FindFirstProviders(ctx, c, limit)
		} else {
			infos, err = o.DHT.FindProviders(ctx, c, limit)
		}
		for _, ai := range infos {
			if len(out) < limit && !containsPeer(out, ai.ID) {
				out = append(out, ai.ID)
				if len(ai.Addrs) > 0 {
					o.Host.Peerstore().AddAddrs(ai.ID, ai.Addrs, peerstore.TempAddrTTL)
				}
			}
		}
	}
	var wg sync.WaitGroup
	connected := make(chan struct{}, len(out))
	dialing := 0
	for _, p := range out {
		if o.Host.Network().Connectedness(p) == network.Connected {
			continue
		}
		dialing++
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A fetch's dials are not ended by ctx when Providers returns
			// early: each is bounded by its own 5 s. A count's end with
			// ctx, as it waits for them.
			dctx := ctx
			if first {
				dctx = context.WithoutCancel(ctx)
			}
			cctx, cancel := context.WithTimeout(dctx, 5*time.Second)
			defer cancel()
			if err := o.Host.Connect(cctx, peer.AddrInfo{ID: p}); err != nil {
				o.log.Debug("p2p: connect to provider", "peer", p, "err", err)
				return
			}
			connected <- struct{}{}
		}()
	}
	switch {
	case !first:
		wg.Wait() // the dials end with ctx
	case dialing > 0 && dialing == len(out):
		// None connected yet: wait for one, or for every dial to fail.
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		select {
		case <-all:
		case <-connected:
		case <-ctx.Done():
		}
	}
	if len(out) > 0 {
		err = nil
	}
	return out, err
}

// awaitRoutingTable waits, at most 2 s, for a routing table that is
// still empty while the host has connections: identify has not yet told
// the DHT which peers speak it, and a lookup now would find nobody.
func (o *Overlay) awaitRoutingTable(ctx context.Context) {
	deadline := time.Now().Add(2 * time.Second)
	for o.DHT.RoutingTableSize() == 0 && len(o.Host.Network().Peers()) > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops everything the overlay started, host last.
func (o *Overlay) Close() error {
	o.cancel()
	o.wg.Wait()
	return o.closeParts()
}

func (o *Overlay) closeParts() error {
	var errs []error
	if o.Router != nil {
		o.Router.Close()
	}
	if o.Signal != nil {
		errs = append(errs, o.Signal.Close())
	}
	if o.Gossip != nil {
		errs = append(errs, o.Gossip.Close())
	}
	if o.DHT != nil {
		errs = append(errs, o.DHT.Close())
	}
	errs = append(errs, o.Host.Close())
	return errors.Join(errs...)
}
