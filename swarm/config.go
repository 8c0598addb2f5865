package swarm

import (
	"errors"

	"github.com/libp2p/go-libp2p/core/peer"
	"log/slog"
	"time"

	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// Source is what a node serves blobs from. *cas.Store implements it.
type Source interface {
	// Stat returns what is known of c, or an error wrapping
	// cas.ErrNotFound. Safe for concurrent use.
	Stat(c cas.CID) (cas.Info, error)
	// AppendSlice appends to dst the bao slice encoding of [off, off+n) of
	// c, verified while read; corrupt data is an error wrapping
	// cas.ErrCorrupt and is never returned. Safe for concurrent use; dst is
	// not kept. A node asks for chunks of at most 256 KiB (serveChunk),
	// at most max(2, GOMAXPROCS) at a time.
	AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error)
}

// UncheckedSource is a Source (and PartialSource) that can serve what it
// stored verified without hashing it again (*cas.Store implements it). A
// node serves through it unless Config.VerifyServed is set: every
// receiver verifies every group before it uses any (PROTOCOL.md section
// 4), so a server's second hash of its own copy protects only against
// its disk having changed the bytes since they were verified, and costs
// a sixth of a seeder's CPU on loopback (swarm/BENCHMARKS.md). Such a
// change reaches the receiver, which bans the server and says so
// (REJECT bad_data); the node then checks what it served that peer
// lately (CheckRange), and what fails is no longer served.
//
// A Source that embeds a *cas.Store and changes what AppendSlice gives
// must change the Unchecked methods likewise (or hide them): embedding
// promotes them, and the node serves through them.
type UncheckedSource interface {
	// AppendSliceUnchecked is AppendSlice with the bytes as stored, not
	// hashed again. Safe for concurrent use; dst is not kept.
	AppendSliceUnchecked(dst []byte, c cas.CID, off, n int64) ([]byte, error)
	// AppendPartialSliceUnchecked is PartialSource's AppendPartialSlice
	// with the bytes as stored. Safe for concurrent use; dst is not kept.
	AppendPartialSliceUnchecked(dst []byte, c cas.CID, off, n int64) ([]byte, error)
	// CheckRange reads [off, off+n) of c, stored whole or being
	// downloaded, and verifies it; what fails is not served again (an
	// error wrapping cas.ErrCorrupt). Safe for concurrent use.
	CheckRange(c cas.CID, off, n int64) error
}

// Config configures a Node. Identity is required; zero values of the rest
// take the documented defaults.
type Config struct {
	Identity *Identity
	// Source is what the node serves to peers; nil serves nothing.
	Source Source
	// VerifyServed hashes every slice served again as it is read, even
	// from a Source that could serve it unchecked (UncheckedSource).
	VerifyServed bool
	// Logger (default: discard). Now is the clock (default time.Now).
	Logger *slog.Logger
	Now    func() time.Time

	// ICEServers are the STUN/TURN servers for real networks (none by
	// default: host candidates only).
	ICEServers []webrtc.ICEServer
	// Loopback restricts ICE to 127.0.0.1: no other address is gathered,
	// bound, or accepted from a peer, and mDNS is off. Tests, demos and
	// benchmarks set it.
	Loopback bool
	// BigMTU is the SCTP packet size used to send to a peer that announced
	// it accepts big packets, on a path known to carry them, at most
	// 16384. 0 means 16384 when Loopback is set (if this build's pion can
	// set it) and off otherwise; set it for a LAN with jumbo frames; -1
	// turns it off.
	// Browsers and the internet get pion's 1191 always.
	BigMTU int
	// Links is how many peer connections (SCTP associations) a fetch opens
	// to each peer: one association is CPU-bound well below what several
	// carry (default 4).
	Links int
	// BulkChannels is the number of bulk data channels per connection
	// (default 2).
	BulkChannels int
	// PieceSize is the byte length of one REQUEST (default 1 MiB; at most
	// wire.MaxRequest).
	PieceSize int
	// Window is how many requests a fetch keeps in flight per connection
	// (default 4).
	Window int
	// MaxOutstanding is how many requests a peer may queue with us per
	// connection before we answer busy (default 32).
	MaxOutstanding int
	// MaxLinks bounds connections in all (default 256), MaxLinksPerPeer
	// those to one peer (default 8), MaxSetups the connection setups in
	// progress (default 32), MaxSetupsPerPeer the setups one peer's offers
	// hold at once (default 4, a fetch's Links).
	MaxLinks, MaxLinksPerPeer, MaxSetups, MaxSetupsPerPeer int
	// SetupProgress bounds how long an offer we answered may go without
	// ICE connectivity before its setup is dropped (default 5s), so that
	// abandoned offers free their slot long before ConnectTimeout.
	SetupProgress time.Duration
	// ServeBudget bounds the bytes the node holds for serving, over all
	// connections: slice bytes read from the Source and not yet
	// acknowledged by the peer's SCTP stack (default 64 MiB, at least
	// 2 MiB; the read buffer and SCTP's copy overlap while a chunk is
	// written, so the memory is at most about twice this). One peer holds
	// at most a quarter of it. A REQUEST that finds no room for its first
	// chunk in min(5s, RequestTimeout/2) is refused with REJECT busy.
	ServeBudget int
	// FetchBudget bounds the bytes the node holds for the answers to its
	// own requests, over all fetches and range fetches: each request's
	// slice buffer, allocated before its REQUEST is sent and held until
	// the slice is verified and written or dropped (default 128 MiB, at
	// least four slices of PieceSize). MaxFetchRequests bounds the
	// requests in flight the same way (default 256). One peer holds at
	// most a quarter of each, so that a peer that answers slowly, or not
	// at all, holds no more however many fetches ask it; a request larger
	// than a peer's share goes alone. A request waits (within its
	// context) for room before it is sent.
	FetchBudget, MaxFetchRequests int
	// MaxOpenBlobs bounds the downloads open at once over all fetches
	// (default 64): each holds a file and its outboard (1/256 of its
	// size) in memory. A fetch opens at most FetchOptions.OpenBlobs of
	// them; one that finds no slot waits for another fetch's to close.
	MaxOpenBlobs int
	// ServeRate caps the bytes a second the node serves, over all peers
	// (0: no cap): an upload cap, so that a seeder on a slow uplink
	// leaves its leechers to trade pieces among themselves.
	ServeRate int64
	// FetchRate caps the bytes a second the node's fetches ask for, over
	// all peers and fetches (0: no cap): a download cap. A request waits
	// for its turn before it is sent (demand overtaking prefetch and
	// background: the pacer in serve.go); the wait does not count
	// towards its timeout, and endgame copies no piece while it waits.
	FetchRate int64
	// SocketBuffer is the UDP socket buffer size asked for (default 4 MiB;
	// the kernel caps it at net.core.rmem_max). Small buffers drop
	// datagrams at high rates and SCTP then backs off.
	SocketBuffer int
	// ConnectTimeout bounds setting up one connection (default 20s),
	// RequestTimeout one request (default 30s).
	ConnectTimeout, RequestTimeout time.Duration
	// BanFor is how long a peer that sent bad data is refused (default 1h).
	BanFor time.Duration
	// Agent is sent in HELLO (default "rdrr-peer").
	Agent string

	// AnnounceAddrs, if set, returns the node's libp2p addresses, sent
	// with every offer and answer (at most 8 of at most 256 bytes). Safe
	// for concurrent use. Start sets it from an Overlay.
	AnnounceAddrs func() []string
	// OnPeerAddrs, if set, receives the libp2p addresses a peer sent in
	// an offer or answer whose signature verified; called on the setup's
	// goroutine, it must not block. Start sets it from an Overlay.
	OnPeerAddrs func(p peer.ID, addrs []string)

	testHooks testHooks // zero outside tests
}

func (c Config) withDefaults() (Config, error) {
	if c.Identity == nil {
		return c, errors.New("swarm: config: no identity")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Links, 4)
	def(&c.BulkChannels, 2)
	def(&c.PieceSize, 1<<20)
	def(&c.Window, 4)
	def(&c.MaxOutstanding, 32)
	def(&c.MaxLinks, 256)
	def(&c.MaxLinksPerPeer, 8)
	def(&c.MaxSetups, 32)
	def(&c.MaxSetupsPerPeer, 4)
	def(&c.SocketBuffer, 4<<20)
	def(&c.ServeBudget, 64<<20)
	c.ServeBudget = max(c.ServeBudget, minServeBudget)
	def(&c.FetchBudget, 128<<20)
	def(&c.MaxFetchRequests, 256)
	def(&c.MaxOpenBlobs, 64)
	c.MaxFetchRequests = max(c.MaxFetchRequests, minFetchRequests)
	c.BulkChannels = min(c.BulkChannels, maxBulk)
	c.MaxOutstanding = min(c.MaxOutstanding, 1<<15)
	if c.PieceSize > wire.MaxRequest || c.PieceSize%cas.GroupSize != 0 {
		return c, errors.New("swarm: config: PieceSize must be a multiple of 16 KiB up to 4 MiB")
	}
	c.FetchBudget = max(c.FetchBudget, minFetchBudget(c.PieceSize))
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur(&c.ConnectTimeout, 20*time.Second)
	defDur(&c.RequestTimeout, 30*time.Second)
	defDur(&c.BanFor, time.Hour)
	defDur(&c.SetupProgress, 5*time.Second)
	if c.Agent == "" {
		c.Agent = "rdrr-peer"
	}
	return c, nil
}

// maxBulk bounds the bulk channels a peer may ask us to accept.
const maxBulk = 16
