package p2p

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	lconnmgr "github.com/libp2p/go-libp2p/p2p/net/connmgr"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rdrr/peer/swarm"
)

// HostConfig configures a Host. Identity is required; zero values of the
// rest take the documented defaults.
type HostConfig struct {
	Identity *swarm.Identity
	// ListenAddrs are the multiaddrs to listen on (default: TCP and QUIC
	// on every IPv4 and IPv6 address, ports chosen by the system; with
	// Loopback, TCP and QUIC on 127.0.0.1).
	ListenAddrs []string
	// Loopback keeps the host on 127.0.0.1: the default listen addresses
	// are loopback ones and, unless Gater is set, a LoopbackGater refuses
	// every dial to and connection from anything else. Tests, demos and
	// benchmarks set it.
	Loopback bool
	// Gater decides which connections are made and accepted (default:
	// LoopbackGater with Loopback, otherwise none).
	Gater connmgr.ConnectionGater
	// MaxConns bounds the host's connections in all (default 512);
	// MaxConnsPerPeer those to one peer (default 8). The connection
	// manager trims down to 3/4 of MaxConns once more than 7/8 are open.
	MaxConns, MaxConnsPerPeer int
	// MaxStreams bounds open streams in all (default 4096); one peer
	// holds at most 256 of them.
	MaxStreams int
	// MaxMemory bounds the bytes libp2p's resource manager lets streams
	// and connections reserve (default 256 MiB).
	MaxMemory int64
	// Registerer, if set, receives libp2p's own metrics (swarm, identify,
	// resource manager); nil turns them off. Metrics of this package are
	// registered by DHT and Gossip on the registerer they are given.
	Registerer prometheus.Registerer
	// Logger (default: discard).
	Logger *slog.Logger
}

// Host is a libp2p host whose key is the peer's swarm identity, so its
// peer ID is the peer's swarm ID. It speaks TCP and QUIC.
type Host struct {
	host.Host
	cfg HostConfig
}

func (c HostConfig) withDefaults() (HostConfig, error) {
	if c.Identity == nil || c.Identity.Key == nil {
		return c, errors.New("p2p: HostConfig.Identity is required")
	}
	if c.Identity.Key.Type() != crypto.Ed25519 {
		return c, fmt.Errorf("p2p: identity key type %v; want Ed25519", c.Identity.Key.Type())
	}
	if len(c.ListenAddrs) == 0 {
		if c.Loopback {
			c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0", "/ip4/127.0.0.1/udp/0/quic-v1"}
		} else {
			c.ListenAddrs = []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1", "/ip6/::/tcp/0", "/ip6/::/udp/0/quic-v1"}
		}
	}
	if c.Gater == nil && c.Loopback {
		c.Gater = LoopbackGater()
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 512
	}
	if c.MaxConnsPerPeer <= 0 {
		c.MaxConnsPerPeer = 8
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = 4096
	}
	if c.MaxMemory <= 0 {
		c.MaxMemory = 256 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// NewHost starts a libp2p host listening on cfg.ListenAddrs. Close it.
func NewHost(cfg HostConfig) (*Host, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	listen := make([]ma.Multiaddr, 0, len(cfg.ListenAddrs))
	for _, s := range cfg.ListenAddrs {
		a, err := ma.NewMultiaddr(s)
		if err != nil {
			return nil, fmt.Errorf("p2p: listen address %q: %w", s, err)
		}
		listen = append(listen, a)
	}
	rm, err := newResourceManager(cfg)
	if err != nil {
		return nil, err
	}
	cm, err := lconnmgr.NewConnManager(cfg.MaxConns*3/4, cfg.MaxConns*7/8, lconnmgr.WithGracePeriod(time.Minute))
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("p2p: connection manager: %w", err)
	}
	opts := []libp2p.Option{
		libp2p.Identity(cfg.Identity.Key),
		libp2p.ListenAddrs(listen...),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.Transport(libp2pquic.NewTransport),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
	}
	if cfg.Gater != nil {
		opts = append(opts, libp2p.ConnectionGater(cfg.Gater))
	}
	if cfg.Registerer != nil {
		opts = append(opts, libp2p.PrometheusRegisterer(cfg.Registerer))
	} else {
		opts = append(opts, libp2p.DisableMetrics())
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		cm.Close()
		return nil, fmt.Errorf("p2p: host: %w", err)
	}
	if h.ID() != cfg.Identity.ID {
		h.Close()
		return nil, fmt.Errorf("p2p: host ID %s is not the identity's %s", h.ID(), cfg.Identity.ID)
	}
	return &Host{Host: h, cfg: cfg}, nil
}

// newResourceManager bounds connections, streams and memory: libp2p's
// defaults (per service and protocol), with the system scope capped by
// cfg and the signaling protocol given its own small per-peer share.
func newResourceManager(cfg HostConfig) (network.ResourceManager, error) {
	scaling := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&scaling)
	scaling.AddProtocolLimit(SignalProtocol,
		rcmgr.BaseLimit{StreamsInbound: 256, StreamsOutbound: 256, Streams: 512, Memory: 16 << 20},
		rcmgr.BaseLimitIncrease{})
	scaling.AddProtocolPeerLimit(SignalProtocol,
		rcmgr.BaseLimit{StreamsInbound: 2, StreamsOutbound: 2, Streams: 4, Memory: 2 * maxSignalFrame},
		rcmgr.BaseLimitIncrease{})
	concrete := scaling.Scale(cfg.MaxMemory, 4*cfg.MaxConns)
	conns, streams := rcmgr.LimitVal(cfg.MaxConns), rcmgr.LimitVal(cfg.MaxStreams)
	perPeerStreams := rcmgr.LimitVal(min(256, cfg.MaxStreams))
	partial := rcmgr.PartialLimitConfig{
		System: rcmgr.ResourceLimits{
			Conns: conns, ConnsInbound: conns, ConnsOutbound: conns, FD: conns,
			Streams: streams, StreamsInbound: streams, StreamsOutbound: streams,
			Memory: rcmgr.LimitVal64(cfg.MaxMemory),
		},
		Transient: rcmgr.ResourceLimits{
			Conns: conns / 4, ConnsInbound: conns / 4, ConnsOutbound: conns / 4,
			Streams: streams / 4, StreamsInbound: streams / 4, StreamsOutbound: streams / 4,
		},
		PeerDefault: rcmgr.ResourceLimits{
			Conns:   rcmgr.LimitVal(cfg.MaxConnsPerPeer),
			Streams: perPeerStreams, StreamsInbound: perPeerStreams, StreamsOutbound: perPeerStreams,
		},
	}
	rm, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(partial.Build(concrete)))
	if err != nil {
		return nil, fmt.Errorf("p2p: resource manager: %w", err)
	}
	return rm, nil
}

// AddrInfo returns the host's ID and listen addresses, what another peer
// needs to connect to it.
func (h *Host) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: h.ID(), Addrs: h.Addrs()}
}

// Identity returns the swarm identity the host was made with.
func (h *Host) Identity() *swarm.Identity { return h.cfg.Identity }
