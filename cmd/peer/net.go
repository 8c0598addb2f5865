package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/pion/webrtc/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/internal/atomicfile"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/swarm/api"
	"github.com/rdrr/peer/swarm/p2p"
	"github.com/spf13/cobra"
)

// minRate is the least --upload-rate and --download-rate: a 16 KiB group
// a second (below that, one 1 MiB piece would wait over a minute).
const minRate = 16 << 10

// defaultTopic is the swarm every peer joins unless told otherwise.
const defaultTopic = "rdrr"

// netCommands returns the network commands: signal, serve, daemon.
func netCommands(a *app) []*cobra.Command {
	return []*cobra.Command{signalCmd(a), serveCmd(a), daemonCmd(a)}
}

func signalCmd(a *app) *cobra.Command {
	var listen string
	var cfg signaling.Config
	cmd := &cobra.Command{
		Use:   "signal --listen 127.0.0.1:7777",
		Short: "Run a signaling server: peers authenticate, join topics and exchange WebRTC offers through it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sig, err := a.startSignal(listen, cfg)
			if err != nil {
				return err
			}
			if err := a.print(map[string]string{"url": sig.url}, func(w io.Writer) { fmt.Fprintln(w, sig.url) }); err != nil {
				sig.stop()
				return err
			}
			select {
			case err = <-sig.errc:
			case <-cmd.Context().Done():
			}
			return errors.Join(err, sig.stop())
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:7777", "address to listen on")
	addSignalLimits(cmd, &cfg)
	return cmd
}

func addSignalLimits(cmd *cobra.Command, cfg *signaling.Config) {
	f := cmd.Flags()
	f.IntVar(&cfg.MaxConns, "max-conns", 0, "open signaling sessions allowed (default 4096)")
	f.IntVar(&cfg.MaxPeersPerTopic, "max-peers-per-topic", 0, "members per topic (default 1024)")
	f.IntVar(&cfg.MaxMessageBytes, "max-message-bytes", 0, "largest message from a client (default 65536)")
	f.Float64Var(&cfg.MessagesPerSecond, "messages-per-second", 0, "sustained messages per second per client (default 50)")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", 0, "close clients silent this long (default 1m)")
	f.IntVar(&cfg.MaxConnsPerAddr, "max-conns-per-addr", 0, "open sessions from one IPv4 address or IPv6 /64 (default 64; -1: no limit)")
	f.IntVar(&cfg.MaxPendingLogins, "max-pending-logins", 0, "sessions not yet authenticated (default 256)")
	f.Int64Var(&cfg.SendQueueBytes, "send-queue-bytes", 0, "bytes queued for one client before it is dropped as a slow consumer (default 1 MiB)")
	f.Int64Var(&cfg.MaxQueuedBytes, "max-queued-bytes", 0, "bytes queued for all clients together (default 256 MiB)")
	f.Float64Var(&cfg.TopicJoinsPerSecond, "topic-joins-per-second", 0, "sustained topic joins per second per client (default 0.2)")
}

// runningSignal is a signaling server started by this process.
type runningSignal struct {
	url  string
	errc chan error // the HTTP server's exit
	stop func() error
}

// startSignal serves a signaling server and its /metrics on listen.
func (a *app) startSignal(listen string, cfg signaling.Config) (*runningSignal, error) {
	cfg.Logger = a.log
	srv := signaling.NewServer(cfg)
	reg := prometheus.NewRegistry()
	reg.MustRegister(srv)
	mux := http.NewServeMux()
	mux.Handle(signaling.Path, srv)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	rs := &runningSignal{url: "ws://" + ln.Addr().String() + signaling.Path, errc: make(chan error, 1)}
	a.log.Info("signaling server listening", "url", rs.url, "metrics", "http://"+ln.Addr().String()+"/metrics")
	go func() { rs.errc <- hs.Serve(ln) }()
	rs.stop = func() error {
		// Sessions first (they hold hijacked connections), then the listener.
		srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return hs.Shutdown(ctx)
	}
	return rs, nil
}

// netFlags are the options shared by the commands that join a swarm.
type netFlags struct {
	signal     string
	topics     []string
	loopback   bool
	iceServers []string
	procedural []string // manifests of synthetic models served without storing them

	// The libp2p overlay (swarm/p2p): DHT, gossip, signaling without a
	// server.
	p2p          bool
	p2pListen    []string
	bootstrap    []string
	announce     time.Duration
	reprovide    time.Duration
	registerer   prometheus.Registerer // the daemon's /metrics, if any
	uploadRate   string                // serving cap (bytes a second), empty: none
	downloadRate string                // fetching cap (bytes a second), empty: none
	// Self-heal (daemon): fetch shards of collections pinned with
	// replicas that lack live copies, every replicateEvery.
	replicate      bool
	replicateEvery time.Duration
	// The daemon's kernel gossip (nil: none).
	kernels *kernelFlags
}

func (nf *netFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&nf.signal, "signal", "", "signaling server (ws://host:port)")
	f.StringSliceVar(&nf.topics, "topic", []string{defaultTopic}, "swarm topics to join (repeatable)")
	f.BoolVar(&nf.loopback, "loopback", false, "connect over 127.0.0.1 only (default: true when the signaling server, or every bootstrap peer, is on loopback)")
	f.StringSliceVar(&nf.iceServers, "ice-server", nil, "STUN/TURN server URL (repeatable)")
	f.StringVar(&nf.downloadRate, "download-rate", "", "cap on the bytes a second fetched from peers, all fetches together; a demand request goes before prefetch and replication (e.g. 10MiB; default: none)")
	nf.p2p = true
}

// addOverlay adds the flags of the libp2p overlay (serve, daemon).
func (nf *netFlags) addOverlay(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&nf.p2p, "p2p", true, "also run the libp2p overlay: DHT provider records, gossip, WebRTC signaling between peers without the server")
	f.StringSliceVar(&nf.p2pListen, "p2p-listen", nil, "libp2p listen multiaddrs (default: TCP and QUIC on every address, on 127.0.0.1 with --loopback; ports chosen by the system)")
	f.StringSliceVar(&nf.bootstrap, "bootstrap", nil, "libp2p multiaddrs /ip4/.../tcp/N/p2p/12D3KooW... of peers to join the overlay through (repeatable; a daemon writes its own to p2p.addr in its home)")
	f.DurationVar(&nf.announce, "announce-interval", time.Minute, "how often new blobs of the store are announced on the DHT and gossip")
	f.DurationVar(&nf.reprovide, "reprovide-interval", 12*time.Hour, "how often every announced blob is announced again (DHT records live 48 h)")
	f.StringVar(&nf.uploadRate, "upload-rate", "", "cap on the bytes a second served to peers, all together (e.g. 10MiB; default: none)")
}

// p2pAddrFile is where a daemon writes its libp2p multiaddrs, one a line.
const p2pAddrFile = "p2p.addr"

// startOverlay starts the libp2p overlay of the net flags, or returns nil
// when it is off.
// banned is the gater's view of the node that the overlay is started
// before: the peers that node banned are refused libp2p connections too.
type banned struct{ node atomic.Pointer[swarm.Node] }

func (b *banned) refuse(p peer.ID) bool {
	n := b.node.Load()
	return n != nil && n.Banned(p)
}

func (a *app) startOverlay(ctx context.Context, nf *netFlags, id *swarm.Identity, loopback bool, ban *banned) (*p2p.Overlay, error) {
	if !nf.p2p {
		return nil, nil
	}
	ov, err := p2p.NewOverlay(ctx, p2p.OverlayConfig{
		Identity:          id,
		Loopback:          loopback,
		ListenAddrs:       nf.p2pListen,
		Bootstrap:         nf.bootstrap,
		SwarmName:         nf.topics[0],
		ReprovideInterval: nf.reprovide,
		Registerer:        nf.registerer,
		Logger:            a.log,
		RefusePeer:        ban.refuse,
	})
	if err != nil {
		return nil, fmt.Errorf("p2p overlay: %w", err)
	}
	a.log.Info("p2p overlay listening", "addrs", ov.P2PAddrs(), "bootstrap", nf.bootstrap)
	return ov, nil
}

// allLoopback reports whether every multiaddr names a loopback address.
func allLoopback(addrs []string) bool {
	for _, s := range addrs {
		m, err := ma.NewMultiaddr(s)
		if err != nil || !manet.IsIPLoopback(m) {
			return false
		}
	}
	return len(addrs) > 0
}

// nodeConfig is the node configuration of the net flags: loopback when the
// signaling server is on loopback (unless --loopback says otherwise).
func (a *app) nodeConfig(cmd *cobra.Command, nf *netFlags, id *swarm.Identity, src swarm.Source) (swarm.Config, string, error) {
	var sigURL string
	loopback := nf.loopback
	if nf.signal != "" || len(nf.bootstrap) == 0 {
		var err error
		if sigURL, err = signalURL(nf.signal); err != nil {
			return swarm.Config{}, "", err
		}
	}
	if cmd == nil || !cmd.Flags().Changed("loopback") {
		loopback = sigURL != "" && isLoopbackURL(sigURL) || sigURL == "" && allLoopback(nf.bootstrap)
	}
	cfg := swarm.Config{Identity: id, Source: src, Loopback: loopback, Logger: a.log}
	if nf.uploadRate != "" {
		r, err := parseBytes(nf.uploadRate)
		if err != nil || r < minRate {
			return swarm.Config{}, "", fmt.Errorf("--upload-rate %q: want a size of at least 16KiB such as 10MiB", nf.uploadRate)
		}
		cfg.ServeRate = r
	}
	if nf.downloadRate != "" {
		r, err := parseBytes(nf.downloadRate)
		if err != nil || r < minRate {
			return swarm.Config{}, "", fmt.Errorf("--download-rate %q: want a size of at least 16KiB such as 10MiB", nf.downloadRate)
		}
		cfg.FetchRate = r
	}
	for _, s := range nf.iceServers {
		cfg.ICEServers = append(cfg.ICEServers, webrtc.ICEServer{URLs: []string{s}})
	}
	if loopback && !swarm.BigPacketsBuilt() {
		a.log.Warn("this binary was built without the SCTP packet-size patch (build with make): loopback and LAN transfers use 1191-byte packets, about 3x slower; browsers and internet peers are unaffected")
	}
	return cfg, sigURL, nil
}

// startMember signs a node in to the swarm (swarm.Start) for a one-off
// command: a fetch, a generation.
func (a *app) startMember(ctx context.Context, cmd *cobra.Command, nf *netFlags, id *swarm.Identity, src swarm.Source) (*member, error) {
	cfg, sigURL, err := a.nodeConfig(cmd, nf, id, src)
	if err != nil {
		return nil, err
	}
	ban := new(banned)
	ov, err := a.startOverlay(ctx, nf, id, cfg.Loopback, ban)
	if err != nil {
		return nil, err
	}
	opt := swarm.StartOptions{Config: cfg, SignalURL: sigURL, Topics: nf.topics, Once: true}
	if ov != nil {
		opt.Overlay = ov
	}
	m, err := swarm.Start(ctx, opt)
	if err != nil {
		if ov != nil {
			ov.Close()
		}
		return nil, err
	}
	ban.node.Store(m.Node())
	a.log.Info("joined the swarm", "peer", id.ID, "signal", sigURL, "topics", nf.topics, "loopback", cfg.Loopback, "big_mtu", m.Node().BigMTU())
	return &member{Member: m, ov: ov}, nil
}

// member is a swarm membership and the overlay it owns.
type member struct {
	*swarm.Member
	ov *p2p.Overlay // nil: none
}

// Close leaves the swarm, then stops the overlay.
func (m *member) Close() error {
	err := m.Member.Close()
	if m.ov != nil {
		err = errors.Join(err, m.ov.Close())
	}
	return err
}

func serveCmd(a *app) *cobra.Command {
	var nf netFlags
	cmd := &cobra.Command{
		Use:   "serve --signal ws://127.0.0.1:7777 [--topic T]",
		Short: "Answer requests for stored blobs from peers of the swarm until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if nf.signal == "" && len(nf.bootstrap) == 0 {
				return errors.New("serve: --signal (or --bootstrap) is required")
			}
			return a.serve(cmd, &nf)
		},
	}
	nf.add(cmd)
	nf.addOverlay(cmd)
	nf.addProcedural(cmd)
	return cmd
}

func daemonCmd(a *app) *cobra.Command {
	var nf netFlags
	var listen, apiListen string
	var cfg signaling.Config
	cmd := &cobra.Command{
		Use:   "daemon [--signal-listen 127.0.0.1:7777] [--signal URL]",
		Short: "Run a seeding peer: serve stored blobs to the swarm, optionally embedding a signaling server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if listen != "" {
				sig, err := a.startSignal(listen, cfg)
				if err != nil {
					return err
				}
				defer sig.stop()
				if nf.signal == "" {
					nf.signal = sig.url
				}
			}
			if nf.signal == "" && len(nf.bootstrap) == 0 {
				return errors.New("daemon: give --signal URL, or --signal-listen to embed a signaling server, or --bootstrap")
			}
			hooks := serveHooks{reg: prometheus.NewRegistry()}
			// The process's own health next to the swarm's: goroutines,
			// heap, resident memory (what a churn test watches for leaks).
			hooks.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			nf.registerer = hooks.reg
			if apiListen != "" {
				stop, err := a.startAPI(apiListen, &hooks)
				if err != nil {
					return err
				}
				defer stop()
			}
			return a.serveWith(cmd, &nf, &hooks)
		},
	}
	nf.add(cmd)
	nf.addOverlay(cmd)
	nf.addProcedural(cmd)
	cmd.Flags().StringVar(&apiListen, "api-listen", "127.0.0.1:7780", "HTTP listener of the JSON API, /metrics and the status page (empty: none); its address is written to api.addr in the home")
	cmd.Flags().StringVar(&listen, "signal-listen", "", "also run a signaling server (with /metrics) on this address")
	cmd.Flags().BoolVar(&nf.replicate, "replicate", false, "keep copies for the swarm: fetch shards of collections pinned with --replicas that have fewer live copies than asked")
	cmd.Flags().DurationVar(&nf.replicateEvery, "replicate-interval", 30*time.Second, "how often replica counts are checked (and the pins with replicas published)")
	nf.kernels = addKernelFlags(cmd)
	addSignalLimits(cmd, &cfg)
	return cmd
}

// serveHooks let the daemon's API see the swarm membership (a new node
// after each reconnection) and the store.
type serveHooks struct {
	mu     sync.Mutex
	member *swarm.Member
	ov     *p2p.Overlay // nil: none
	store  *cas.Store
	ready  chan struct{}        // closed once the store is open
	reg    *prometheus.Registry // the overlay's metrics, served on /metrics
	repl   *swarm.Replicator    // nil: no overlay
	kern   *kernelDaemon        // nil: no kernel gossip
	app    *api.AppConfig       // what the browser peer at /app/ starts with
}

// node returns the node of the moment and the membership (nil, nil before
// the daemon started; a nil node while it reconnects).
func (h *serveHooks) node() (*swarm.Node, *swarm.Member) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.member == nil {
		return nil, nil
	}
	return h.member.Node(), h.member
}

// nodeWait is how long an API call that needs the swarm waits for the
// daemon to start or to reconnect before it gives up.
const nodeWait = 20 * time.Second

// waitNode returns the node of the moment, waiting up to nodeWait (or
// until ctx ends) while the daemon starts or reconnects: a fetch asked
// of a daemon that is still joining is served once it has joined, not
// refused.
func (h *serveHooks) waitNode(ctx context.Context) (*swarm.Node, *swarm.Member, error) {
	n, err := awaitNode(ctx, func() *swarm.Node { n, _ := h.node(); return n })
	if err != nil {
		return nil, nil, err
	}
	_, m := h.node()
	return n, m, nil
}

// awaitNode polls get until it returns a node, for up to nodeWait or
// until ctx ends.
func awaitNode(ctx context.Context, get func() *swarm.Node) (*swarm.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, nodeWait)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if n := get(); n != nil {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return nil, errors.New("the daemon is not in the swarm right now (starting or reconnecting)")
		case <-tick.C:
		}
	}
}

// serve keeps this peer in the swarm, answering requests for stored blobs,
// until the command's context ends.
func (a *app) serve(cmd *cobra.Command, nf *netFlags) error {
	return a.serveWith(cmd, nf, nil)
}

func (a *app) serveWith(cmd *cobra.Command, nf *netFlags, hooks *serveHooks) error {
	id, err := swarm.LoadIdentity(a.home)
	if err != nil {
		return err
	}
	return a.withStore(func(st *cas.Store) error {
		ctx := cmd.Context()
		src, err := a.sources(st, nf.procedural)
		if err != nil {
			return err
		}
		if hooks != nil {
			hooks.mu.Lock()
			hooks.store = st
			hooks.mu.Unlock()
			if hooks.ready != nil {
				close(hooks.ready)
			}
		}
		if err := a.print(map[string]string{"peer": id.ID.String()}, func(w io.Writer) { fmt.Fprintln(w, "serving as", id.ID) }); err != nil {
			return err
		}
		// Stay in the swarm (swarm.Start): sign in again whenever the
		// signaling session drops, backing off up to 30 s, and keep
		// trying if the server is not up yet.
		cfg, sigURL, err := a.nodeConfig(cmd, nf, id, src)
		if err != nil {
			return err
		}
		if hooks != nil {
			hooks.mu.Lock()
			hooks.app = &api.AppConfig{Signal: sigURL, Topics: nf.topics, Loopback: cfg.Loopback}
			hooks.mu.Unlock()
		}
		ban := new(banned)
		ov, err := a.startOverlay(ctx, nf, id, cfg.Loopback, ban)
		if err != nil {
			return err
		}
		opt := swarm.StartOptions{Config: cfg, SignalURL: sigURL, Topics: nf.topics, Persist: true}
		if ov != nil {
			opt.Overlay = ov
			opt.AnnounceEvery = nf.announce
			opt.Announce = func(context.Context) ([]cas.CID, error) { return storedCIDs(st) }
			addrs := strings.Join(ov.P2PAddrs(), "\n") + "\n"
			if err := atomicfile.Write(filepath.Join(a.home, p2pAddrFile), []byte(addrs), 0o644); err != nil {
				a.log.Warn("cannot write the p2p address file", "err", err)
			}
			defer os.Remove(filepath.Join(a.home, p2pAddrFile))
		}
		m, err := swarm.Start(ctx, opt)
		if err != nil {
			if ov != nil {
				ov.Close()
			}
			return err
		}
		ban.node.Store(m.Node())
		var repl *swarm.Replicator
		replDone := make(chan struct{})
		if n := m.Node(); ov != nil && n != nil {
			repl, err = swarm.NewReplicator(swarm.ReplicatorConfig{
				Node: n, Store: st, Overlay: ov, Replicate: nf.replicate, Every: nf.replicateEvery,
				Discover: m.Discover, Providers: m.Providers,
				Stored: func(cas.CID) { m.AnnounceSoon() }, Logger: a.log,
			})
			if err != nil {
				return err
			}
			if err := a.loadReplicas(repl); err != nil {
				a.log.Warn("replica targets not restored", "err", err)
			}
			go func() { defer close(replDone); repl.Run(ctx) }()
		} else {
			close(replDone)
		}
		if hooks != nil {
			hooks.mu.Lock()
			hooks.member, hooks.ov, hooks.repl = m, ov, repl
			hooks.mu.Unlock()
		}
		kern, err := a.startKernels(ctx, nf.kernels, ov, st, swarmFetcher{m, st}, nf.registerer)
		if err != nil {
			a.log.Warn("kernel gossip off", "err", err)
		}
		if hooks != nil {
			hooks.mu.Lock()
			hooks.kern = kern
			hooks.mu.Unlock()
		}
		<-ctx.Done()
		<-replDone
		if kern != nil {
			if err := kern.Close(); err != nil {
				a.log.Warn("kernel gossip", "err", err)
			}
		}
		err = m.Close()
		if ov != nil {
			err = errors.Join(err, ov.Close())
		}
		return err
	})
}

// storedCIDs lists the whole blobs of st (what the daemon announces).
func storedCIDs(st *cas.Store) ([]cas.CID, error) {
	var out []cas.CID
	err := st.List(func(i cas.Info) error {
		if !i.Corrupt {
			out = append(out, i.CID)
		}
		return nil
	})
	return out, err
}

// fetchFromSwarm makes blob c (and its shards, if it is a collection)
// present in st, fetching from the peers found through the signaling
// server at signalURL in topic (default: the default swarm and the topic
// named by the CID), at most downloadRate bytes a second if it is not
// empty (--download-rate). verified, if not nil, is given each piece as
// it is verified (swarm.FetchOptions.Verified).
func fetchFromSwarm(ctx context.Context, a *app, st *cas.Store, c cas.CID, signalURL, topic, downloadRate string, verified func(cas.CID, int64, []byte)) error {
	id, _, err := swarm.InitIdentity(a.home)
	if err != nil {
		return err
	}
	nf := netFlags{signal: signalURL, topics: []string{topic}, p2p: true, downloadRate: downloadRate}
	if topic == "" {
		nf.topics = []string{defaultTopic, c.String()}
	}
	// While fetching we serve what we have, as a good swarm citizen.
	m, err := a.startMember(ctx, nil, &nf, id, st)
	if err != nil {
		return err
	}
	defer m.Close()
	node, discover := m.Node(), m.Discover
	start := time.Now()
	last := start
	_, err = node.Fetch(ctx, st, c, swarm.FetchOptions{
		Discover:  discover,
		Providers: m.Providers,
		Verified:  verified,
		Progress: func(done, total int64) {
			if now := time.Now(); now.Sub(last) >= time.Second || done == total {
				last = now
				a.log.Info("fetching", "cid", c, "done", done, "total", total,
					"MB/s", fmt.Sprintf("%.1f", float64(done)/now.Sub(start).Seconds()/1e6))
			}
		},
	})
	if err != nil {
		return err
	}
	a.log.Info("fetched", "cid", c, "bytes", node.Stats().FetchedBytes, "in", time.Since(start).Round(time.Millisecond), "stats", fmt.Sprintf("%+v", node.Stats()))
	return nil
}

// signalURL accepts ws://host:port (adding the protocol path) or a full
// URL.
func signalURL(s string) (string, error) {
	if s == "" {
		return "", errors.New("no signaling server (--signal ws://host:port)")
	}
	if !strings.Contains(s, "://") {
		s = "ws://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("signaling server %q: %w", s, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("signaling server %q: scheme must be ws or wss", s)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = signaling.Path
	}
	return u.String(), nil
}

// isLoopbackURL reports whether u's host is a loopback address: a local
// signaling server means a local swarm, so ICE is kept to 127.0.0.1.
func isLoopbackURL(s string) bool {
	u, err := url.Parse(s)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// replicasFile keeps, in the home, the targets pinned with --replicas on
// this daemon, so that a restart keeps asking for them.
const replicasFile = "replicas.json"

type savedReplica struct {
	CID      string `json:"cid"`
	Replicas int    `json:"replicas"`
}

// loadReplicas pins in repl the targets saved in the home.
func (a *app) loadReplicas(repl *swarm.Replicator) error {
	b, err := os.ReadFile(filepath.Join(a.home, replicasFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var saved []savedReplica
	if err := json.Unmarshal(b, &saved); err != nil {
		return fmt.Errorf("%s: %w", replicasFile, err)
	}
	for _, r := range saved {
		c, err := cas.ParseCID(r.CID)
		if err != nil {
			return fmt.Errorf("%s: %w", replicasFile, err)
		}
		if err := repl.Pin(c, r.Replicas); err != nil {
			return err
		}
	}
	return nil
}

// pinReplicas pins c with r replicas in repl and saves the targets.
func (a *app) pinReplicas(repl *swarm.Replicator, c cas.CID, r int) error {
	if err := repl.Pin(c, r); err != nil {
		return err
	}
	var saved []savedReplica
	for _, t := range repl.Targets() {
		saved = append(saved, savedReplica{CID: t.CID.String(), Replicas: t.Replicas})
	}
	b, err := json.MarshalIndent(saved, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(a.home, replicasFile), append(b, '\n'), 0o644)
}
