package p2p

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	dht "github.com/libp2p/go-libp2p-kad-dht"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rdrr/peer/cas"
)

// DHTPrefix is the protocol prefix of the swarm's DHT: its peers speak
// /rdrr/kad/1.0.0 and never join the public IPFS DHT.
const DHTPrefix protocol.ID = "/rdrr"

// DHTMode says whether a peer answers DHT queries.
type DHTMode int

const (
	// DHTAuto serves when libp2p finds the host publicly reachable.
	DHTAuto DHTMode = iota
	// DHTServer always serves (small swarms, tests, seeders with a
	// public address).
	DHTServer
	// DHTClient only queries.
	DHTClient
)

// DHTConfig configures a DHT. Zero values take the documented defaults.
type DHTConfig struct {
	Mode DHTMode
	// Bootstrap are multiaddrs with a /p2p/ part of peers to join through
	// (none by default: there are no public bootstrap peers).
	Bootstrap []string
	// ReprovideInterval is how often every provided CID is announced again
	// (default 12 h; provider records live 48 h).
	ReprovideInterval time.Duration
	// FindTimeout bounds one FindProviders lookup (default 30 s);
	// ProvideTimeout one announcement (default 60 s).
	FindTimeout, ProvideTimeout time.Duration
	// MaxProvided bounds the CIDs kept for re-providing (default 1<<20);
	// Provide refuses more.
	MaxProvided int
	// ProvideConcurrency bounds the announcements a re-provide round
	// makes at once (default 8).
	ProvideConcurrency int
	// Registerer, if set, receives the DHT's metrics.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (c DHTConfig) withDefaults() DHTConfig {
	if c.ReprovideInterval <= 0 {
		c.ReprovideInterval = 12 * time.Hour
	}
	if c.FindTimeout <= 0 {
		c.FindTimeout = 30 * time.Second
	}
	if c.ProvideTimeout <= 0 {
		c.ProvideTimeout = time.Minute
	}
	if c.MaxProvided <= 0 {
		c.MaxProvided = 1 << 20
	}
	if c.ProvideConcurrency <= 0 {
		c.ProvideConcurrency = 8
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// DHT is the swarm's content routing: provider records for the blobs a
// peer serves, found by others when a fetch needs providers.
type DHT struct {
	h   *Host
	d   *dht.IpfsDHT
	cfg DHTConfig
	m   dhtMetrics

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	provided map[cas.Digest]cas.CID // re-provided on a timer
}

type dhtMetrics struct {
	lookups  *prometheus.CounterVec   // result
	latency  *prometheus.HistogramVec // op
	provides *prometheus.CounterVec   // result
	rtSize   prometheus.GaugeFunc
	provided prometheus.GaugeFunc
}

// NewDHT starts the DHT on h. It does not connect to anyone: call
// Bootstrap. Close it before h.
func NewDHT(ctx context.Context, h *Host, cfg DHTConfig) (*DHT, error) {
	cfg = cfg.withDefaults()
	boot, err := parseAddrInfos(cfg.Bootstrap)
	if err != nil {
		return nil, err
	}
	mode := dht.ModeAuto
	switch cfg.Mode {
	case DHTServer:
		mode = dht.ModeServer
	case DHTClient:
		mode = dht.ModeClient
	}
	d, err := dht.New(ctx, h,
		dht.ProtocolPrefix(DHTPrefix),
		dht.Mode(mode),
		dht.DisableValues(),
		// When the routing table empties, libp2p reconnects through the
		// configured peers (and only those).
		dht.BootstrapPeers(boot...),
	)
	if err != nil {
		return nil, fmt.Errorf("p2p: dht: %w", err)
	}
	x := &DHT{h: h, d: d, cfg: cfg, provided: make(map[cas.Digest]cas.CID)}
	x.ctx, x.cancel = context.WithCancel(context.Background())
	x.m = dhtMetrics{
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rdrr_dht_lookups_total",
			Help: "Provider lookups on the DHT, by result (found, none, error).",
		}, []string{"result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "rdrr_dht_lookup_seconds",
			Help:    "Time of DHT operations: find_providers (to the end of the lookup), provide.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"op"}),
		provides: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rdrr_dht_provides_total",
			Help: "Provider records announced on the DHT, by result (ok, error).",
		}, []string{"result"}),
		rtSize: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rdrr_dht_routing_table_peers",
			Help: "Peers in the DHT routing table.",
		}, func() float64 { return float64(d.RoutingTable().Size()) }),
		provided: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rdrr_dht_provided_cids",
			Help: "Blobs this peer announces on the DHT (re-provided on a timer).",
		}, func() float64 { return float64(x.Provided()) }),
	}
	if r := cfg.Registerer; r != nil {
		for _, c := range []prometheus.Collector{x.m.lookups, x.m.latency, x.m.provides, x.m.rtSize, x.m.provided} {
			if err := r.Register(c); err != nil {
				d.Close()
				return nil, fmt.Errorf("p2p: dht metrics: %w", err)
			}
		}
	}
	x.wg.Add(1)
	go x.reprovideLoop()
	return x, nil
}

// parseAddrInfos reads multiaddrs that end in /p2p/<id>.
func parseAddrInfos(addrs []string) ([]peer.AddrInfo, error) {
	mas := make([]ma.Multiaddr, 0, len(addrs))
	for _, s := range addrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("p2p: bootstrap address %q: %w", s, err)
		}
		mas = append(mas, a)
	}
	infos, err := peer.AddrInfosFromP2pAddrs(mas...)
	if err != nil {
		return nil, fmt.Errorf("p2p: bootstrap addresses: %w", err)
	}
	return infos, nil
}

// Bootstrap connects to the configured bootstrap peers and to peers (the
// members of a signaling topic, say: a peer without addresses is dialled
// only if the host already knows some), at most 16 at a time, then starts
// a routing table refresh. It fails only if nobody could be reached.
func (x *DHT) Bootstrap(ctx context.Context, peers []peer.AddrInfo) error {
	boot, err := parseAddrInfos(x.cfg.Bootstrap)
	if err != nil {
		return err
	}
	all := append(boot, peers...)
	sem := make(chan struct{}, 16)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ok   int
		errs []error
	)
	for _, ai := range all {
		if ai.ID == x.h.ID() {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			err := x.h.Connect(cctx, ai)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if len(errs) < 8 {
					errs = append(errs, err)
				}
				return
			}
			ok++
		}()
	}
	wg.Wait()
	if err := x.d.Bootstrap(ctx); err != nil {
		return fmt.Errorf("p2p: dht bootstrap: %w", err)
	}
	if ok == 0 && len(errs) > 0 {
		return fmt.Errorf("p2p: dht bootstrap: no peer reached: %w", errors.Join(errs...))
	}
	return nil
}

// RoutingTableSize returns how many peers the routing table holds.
func (x *DHT) RoutingTableSize() int { return x.d.RoutingTable().Size() }

// Refresh refreshes the routing table and waits until done or ctx ends.
func (x *DHT) Refresh(ctx context.Context) error {
	select {
	case err := <-x.d.RefreshRoutingTable():
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Provide announces that this peer serves c, now and every
// ReprovideInterval until Unprovide. It waits for the announcement (at
// most ProvideTimeout).
func (x *DHT) Provide(ctx context.Context, c cas.CID) error {
	x.mu.Lock()
	if _, ok := x.provided[c.Digest()]; !ok && len(x.provided) >= x.cfg.MaxProvided {
		x.mu.Unlock()
		return fmt.Errorf("p2p: provide %s: already %d blobs provided (MaxProvided)", c, x.cfg.MaxProvided)
	}
	x.provided[c.Digest()] = c
	x.mu.Unlock()
	return x.provide(ctx, c)
}

func (x *DHT) provide(ctx context.Context, c cas.CID) error {
	gc, err := goCID(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, x.cfg.ProvideTimeout)
	defer cancel()
	start := time.Now()
	err = x.d.Provide(ctx, gc, true)
	x.m.latency.WithLabelValues("provide").Observe(time.Since(start).Seconds())
	if err != nil {
		x.m.provides.WithLabelValues("error").Inc()
		return fmt.Errorf("p2p: provide %s: %w", c, err)
	}
	x.m.provides.WithLabelValues("ok").Inc()
	return nil
}

// Unprovide stops re-providing c (records already out expire by
// themselves).
func (x *DHT) Unprovide(c cas.CID) {
	x.mu.Lock()
	delete(x.provided, c.Digest())
	x.mu.Unlock()
}

// Provided returns how many blobs are kept announced.
func (x *DHT) Provided() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.provided)
}

// findGrace is how long a fetch's provider lookup (FindFirstProviders)
// goes on after it found the first provider. A lookup that has fewer than its limit to find runs
// until it asked every peer near the key, and a peer that left (a
// leecher gone, whose records and routing entries outlive it) holds it
// for a dial timeout: 5 s of every fetch after a peer left, on loopback.
// A fetch can start from one provider and finds others as it goes (the
// HAVE announcements of the peers it asks, gossip, the signaling topic).
const findGrace = 250 * time.Millisecond

// FindProviders returns up to limit peers other than this one that
// announced c (or the same bytes under another codec), searching at most
// FindTimeout. Addresses are what the providers announced; a caller
// should still verify everything it fetches.
func (x *DHT) FindProviders(ctx context.Context, c cas.CID, limit int) ([]peer.AddrInfo, error) {
	return x.findProviders(ctx, c, limit, 0)
}

// FindFirstProviders is FindProviders for a fetch, which can start from
// one provider: the lookup stops findGrace after it found one that this
// host is connected to (a record of a peer gone does not end it; without
// a connected provider the lookup runs as FindProviders does).
func (x *DHT) FindFirstProviders(ctx context.Context, c cas.CID, limit int) ([]peer.AddrInfo, error) {
	return x.findProviders(ctx, c, limit, findGrace)
}

// findProviders looks c up; grace > 0 ends the lookup that long after the
// first provider found that this host is connected to.
func (x *DHT) findProviders(ctx context.Context, c cas.CID, limit int, grace time.Duration) ([]peer.AddrInfo, error) {
	if limit <= 0 {
		return nil, errors.New("p2p: FindProviders: limit must be positive")
	}
	gc, err := goCID(c)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, x.cfg.FindTimeout)
	defer cancel()
	lookup, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	var out []peer.AddrInfo
	at := make(map[peer.ID]int) // index in out
	withAddrs := 0
	// One more than limit: this peer may be among them. A provider comes
	// again when a later answer has addresses for it.
	var graceTimer *time.Timer
	defer func() {
		if graceTimer != nil {
			graceTimer.Stop()
		}
	}()
	for ai := range x.d.FindProvidersAsync(lookup, gc, limit+1) {
		if ai.ID == x.h.ID() {
			continue
		}
		if grace > 0 && graceTimer == nil && x.h.Network().Connectedness(ai.ID) == network.Connected {
			// A provider this host is connected to (alive, unlike a
			// record of a peer gone): a little longer for more.
			graceTimer = time.AfterFunc(grace, stop)
		}
		if i, ok := at[ai.ID]; ok {
			if len(out[i].Addrs) == 0 && len(ai.Addrs) > 0 {
				out[i].Addrs = ai.Addrs
				withAddrs++
			}
		} else if len(out) < limit {
			at[ai.ID] = len(out)
			out = append(out, ai)
			if len(ai.Addrs) > 0 {
				withAddrs++
			}
		}
		if withAddrs == limit {
			stop() // enough: end the lookup (the channel drains and closes)
		}
	}
	x.m.latency.WithLabelValues("find_providers").Observe(time.Since(start).Seconds())
	switch {
	case len(out) > 0:
		x.m.lookups.WithLabelValues("found").Inc()
		return out, nil
	case ctx.Err() != nil && ctx.Err() != context.DeadlineExceeded:
		x.m.lookups.WithLabelValues("error").Inc()
		return nil, ctx.Err()
	}
	x.m.lookups.WithLabelValues("none").Inc()
	return nil, nil
}

// reprovideLoop announces every provided CID again each interval.
func (x *DHT) reprovideLoop() {
	defer x.wg.Done()
	t := time.NewTicker(x.cfg.ReprovideInterval)
	defer t.Stop()
	for {
		select {
		case <-x.ctx.Done():
			return
		case <-t.C:
			x.Reprovide(x.ctx)
		}
	}
}

// Reprovide announces every provided CID now, ProvideConcurrency at a
// time, and returns how many announcements failed. The timer calls it.
func (x *DHT) Reprovide(ctx context.Context) (failed int) {
	x.mu.Lock()
	cids := make([]cas.CID, 0, len(x.provided))
	for _, c := range x.provided {
		cids = append(cids, c)
	}
	x.mu.Unlock()
	sem := make(chan struct{}, x.cfg.ProvideConcurrency)
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for i, c := range cids {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return failed + len(cids) - i
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := x.provide(ctx, c); err != nil {
				x.cfg.Logger.Debug("p2p: re-provide", "cid", c, "err", err)
				mu.Lock()
				failed++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed
}

// Close stops re-providing and the DHT.
func (x *DHT) Close() error {
	x.cancel()
	x.wg.Wait()
	return x.d.Close()
}
