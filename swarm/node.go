package swarm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	piontransport "github.com/pion/transport/v4"
	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm/wire"
)

// Signaler relays offers, answers and candidates to peers by ID.
// *signaling.Client implements it.
type Signaler interface {
	// Send relays m (its To set) without waiting for delivery. Safe for
	// concurrent use.
	Send(ctx context.Context, m *signaling.Message) error
	// Incoming delivers relayed messages (From set); it is closed when the
	// signaling session ends. The node is its only reader.
	Incoming() <-chan *signaling.Message
}

// Event kinds.
const (
	EventBadData  = "bad_data"   // a slice from the peer failed verification
	EventProtocol = "protocol"   // the peer broke the wire protocol
	EventIdentity = "identity"   // the peer's certificate or signature did not match its ID
	EventBanned   = "banned"     // the peer was banned
	EventRefused  = "refused"    // a connection from the peer was refused (limit, ban)
	EventNoBigMTU = "no_big_mtu" // big SCTP packets did not reach the peer: it gets default ones
)

// Event is something a peer did that the node acted on.
type Event struct {
	Time     time.Time
	Peer     peer.ID
	Kind     string
	CID      cas.CID // bad_data: the blob
	Off, Len int64   // bad_data: the first bad group
	Detail   string
}

// Stats counts what a node moved.
type Stats struct {
	Links        int   // open connections
	FetchedBytes int64 // verified bytes written to the store
	// VerifiedSlices counts the answers from peers (a piece, the rest of
	// one, a range) that verified and were written: the pieces verified,
	// as BadSlices counts those that failed.
	VerifiedSlices int64
	ServedBytes    int64 // bytes of data served
	// ServedPartialBytes is the part of ServedBytes served from
	// downloads in progress (PartialSource).
	ServedPartialBytes int64
	ServingBytes       int64 // bytes held for serving now (at most Config.ServeBudget)
	// FetchingBytes and FetchRequests are what the node's own requests
	// in flight hold now (at most Config.FetchBudget and
	// Config.MaxFetchRequests).
	FetchingBytes int64
	FetchRequests int
	BadSlices     int64 // slices that failed verification
	// CorruptServed counts ranges we served that a peer refused and
	// that then failed our own check (UncheckedSource): the disk
	// changed them.
	CorruptServed int64
	Bans          int64
	LinksAccepted int64
	LinksDialed   int64
	// AskRoundsCut counts a fetch's ask rounds that went on without
	// peers still connecting, askGrace after another had what was
	// wanted (a dead peer listed somewhere holds its setup that long).
	AskRoundsCut int64
}

type nodeStats struct {
	fetchedBytes, servedBytes, servedPartialBytes, badSlices, bans, accepted, dialed atomic.Int64
	corruptServed, verifiedSlices, askCuts                                           atomic.Int64
}

// verified counts a peer's answer of n bytes that verified and was written.
func (st *nodeStats) verified(n int64) {
	st.fetchedBytes.Add(n)
	st.verifiedSlices.Add(1)
}

const (
	maxEvents  = 256
	maxBanned  = 4096
	setupInbox = 64
)

// Node is a peer's presence in the swarm: it answers and makes WebRTC
// connections through a signaling server, serves blobs from its Source and
// fetches blobs into a cas store. Its methods are safe for concurrent use.
type Node struct {
	cfg Config
	id  *Identity
	log *slog.Logger
	tr  *transport

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // dispatcher, setups, peer connection closers
	stats  nodeStats
	budget *serveBudget // bytes held for serving
	// fetching bounds the requests in flight of the node's fetches and
	// the bytes they hold; open bounds their open downloads.
	fetching *fetchBudget
	open     openSlots
	// readSem bounds the Source reads in progress: each holds a read
	// buffer of the store's, and reading is CPU-bound (verification).
	readSem chan struct{}
	pace    *pacer // Config.ServeRate; nil: no cap
	// fetchPace is Config.FetchRate's (nil: no cap): each request waits
	// on it before admit.
	fetchPace *pacer
	prio      *prioGate
	// checkSem lets one check of what we served run at a time
	// (checkServed).
	checkSem chan struct{}

	mu       sync.Mutex
	closed   bool
	sig      Signaler
	links    map[peer.ID][]*link
	nlinks   int
	dialing  map[peer.ID]int // fetcher.widen's dials in progress
	setups   map[setupKey]*setup
	banned   map[peer.ID]time.Time
	events   []Event
	allLink  map[*link]struct{}    // every link not yet fully stopped
	strikes  map[peer.ID]strike    // protocol violations, at most maxBanned peers
	smallMTU map[peer.ID]time.Time // peers big packets did not reach, until when
	// haveDirty: blobs whose pieces changed since the last
	// have-announcement (partial.go), at most maxAnnounce, with their
	// sizes (-1: unknown); haveLoop: the announcing goroutine runs.
	haveDirty map[cas.CID]int64
	haveLoop  bool
	perPeer   map[peer.ID]*PeerBytes // at most maxPeerStats
	fetches   map[*fetcher]struct{}  // fetches running: announcements go to them
}

// strike counts a peer's protocol violations (each closed a link).
type strike struct {
	n     int
	first time.Time
}

// maxStrikes protocol violations within BanFor ban a peer: one may be a
// bug or a race at close; three are a pattern.
const maxStrikes = 3

// testHooks let tests play a dishonest peer; always zero outside tests.
type testHooks struct {
	mangleSDP  func(kind, sdp string) string                        // applied to our SDP before signing
	signingKey crypto.PrivKey                                       // signs our descriptions instead of the identity key
	tamper     func(kind string, d json.RawMessage) json.RawMessage // applied after signing (a relay in the middle)
	// noPionFingerprintCheck leaves the certificate check to verifyRemote
	// alone, to show that it holds by itself.
	noPionFingerprintCheck bool
	// serve answers a queued REQUEST instead of serveOne (a dishonest
	// server); its error closes the link.
	serve func(l *link, ch *channel, job serveJob) error
	// noReadBulk leaves the bulk channels unread: a peer that asks and
	// never reads.
	noReadBulk bool
	// receiveMTU sets pion's UDP read size (and not what we announce).
	receiveMTU uint
	// bigMTUProbe, if set, replaces the constant bigMTUProbe.
	bigMTUProbe time.Duration
	// noPartialCap leaves CapPartial out of our HELLO: a peer from before
	// partial serving.
	noPartialCap bool
	// checked sees the result of each check of what we served
	// (checkServed).
	checked func(c cas.CID, off, n int64, err error)
	// wrapUDP, if set, wraps every UDP socket pion opens (a path with a
	// delay).
	wrapUDP func(piontransport.UDPConn) piontransport.UDPConn
	// settings, if set, adjusts each pion SettingEngine last (native).
	settings func(*webrtc.SettingEngine)
}

type setupKey struct {
	peer peer.ID
	sid  string
}

// NewNode makes a node. Call Start to connect it to a signaling session.
func NewNode(cfg Config) (*Node, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	tr, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Node{
		cfg:       cfg,
		id:        cfg.Identity,
		log:       cfg.Logger,
		tr:        tr,
		ctx:       ctx,
		cancel:    cancel,
		links:     make(map[peer.ID][]*link),
		dialing:   make(map[peer.ID]int),
		setups:    make(map[setupKey]*setup),
		banned:    make(map[peer.ID]time.Time),
		allLink:   make(map[*link]struct{}),
		strikes:   make(map[peer.ID]strike),
		smallMTU:  make(map[peer.ID]time.Time),
		haveDirty: make(map[cas.CID]int64),
		perPeer:   make(map[peer.ID]*PeerBytes),
		fetches:   make(map[*fetcher]struct{}),
		budget:    newServeBudget(cfg.ServeBudget),
		fetching:  newFetchBudget(cfg.FetchBudget, cfg.MaxFetchRequests),
		open:      make(openSlots, cfg.MaxOpenBlobs),
		readSem:   make(chan struct{}, max(2, runtime.GOMAXPROCS(0))),
		checkSem:  make(chan struct{}, 1),
		pace:      newPacer(cfg.ServeRate),
		fetchPace: newPacer(cfg.FetchRate),
		prio:      newPrioGate(),
	}, nil
}

// ID returns the node's peer ID.
func (n *Node) ID() peer.ID { return n.id.ID }

// BigMTU returns the SCTP packet size the node uses towards peers that
// accept big packets, or 0 if it never does.
func (n *Node) BigMTU() int { return n.tr.bigMTU }

// Start makes the node answer offers arriving through sig, and use sig to
// reach peers. The node becomes sig.Incoming's only reader.
func (n *Node) Start(sig Signaler) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	if n.sig != nil {
		return errors.New("swarm: node already started")
	}
	n.sig = sig
	n.wg.Add(1)
	go n.dispatch(sig)
	return nil
}

func (n *Node) dispatch(sig Signaler) {
	defer n.wg.Done()
	for {
		select {
		case m, ok := <-sig.Incoming():
			if !ok {
				return
			}
			n.route(m)
		case <-n.ctx.Done():
			return
		}
	}
}

func (n *Node) route(m *signaling.Message) {
	if m.Type == signaling.TypeError {
		n.refused(m)
		return
	}
	from, err := peer.Decode(m.From)
	if err != nil {
		return
	}
	switch m.Type {
	case signaling.TypeOffer:
		n.acceptOffer(from, m)
	case signaling.TypeAnswer, signaling.TypeCandidate, signaling.TypeBye:
		n.mu.Lock()
		s := n.setups[setupKey{from, m.SID}]
		n.mu.Unlock()
		if s == nil {
			return // a setup that ended: late candidates are normal
		}
		select {
		case s.inbox <- m:
		default:
			n.log.Debug("swarm: setup inbox full; dropped", "peer", from, "type", m.Type)
		}
	}
}

// refused hands the server's refusal to relay a message to a peer that
// is not connected to it (unknown_peer) to the setups dialing that peer:
// their offer or candidates are lost, so they fail now, not at
// ConnectTimeout. A peer that left, still listed in a topic or a provider
// record, then costs a fetch's ask round nothing. A setup whose messages
// go over libp2p gets such a refusal only if another message to that
// peer went through the server, which cannot reach it either.
func (n *Node) refused(m *signaling.Message) {
	if m.Code != signaling.CodeUnknownPeer {
		return
	}
	p, err := peer.Decode(m.Peer)
	if err != nil {
		return
	}
	n.mu.Lock()
	var dialing []*setup
	for k, s := range n.setups {
		if k.peer == p && !s.incoming {
			dialing = append(dialing, s)
		}
	}
	n.mu.Unlock()
	for _, s := range dialing {
		select {
		case s.inbox <- m:
		default: // full of the peer's messages: it is not gone
		}
	}
}

// record keeps ev (bounded) and logs it.
func (n *Node) record(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = n.cfg.Now()
	}
	n.mu.Lock()
	if len(n.events) >= maxEvents {
		n.events = append(n.events[:0], n.events[1:]...)
	}
	n.events = append(n.events, ev)
	n.mu.Unlock()
	attrs := []any{"peer", ev.Peer, "kind", ev.Kind}
	if !ev.CID.IsZero() {
		attrs = append(attrs, "cid", ev.CID, "off", ev.Off, "len", ev.Len)
	}
	n.log.Warn("swarm: peer event", append(attrs, "detail", ev.Detail)...)
}

// Events returns the recorded peer events, oldest first.
func (n *Node) Events() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Event(nil), n.events...)
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	nl := n.nlinks
	n.mu.Unlock()
	serving, _ := n.budget.held("")
	fetching, _ := n.fetching.held("")
	return Stats{
		Links:              nl,
		FetchedBytes:       n.stats.fetchedBytes.Load(),
		VerifiedSlices:     n.stats.verifiedSlices.Load(),
		ServedBytes:        n.stats.servedBytes.Load(),
		ServedPartialBytes: n.stats.servedPartialBytes.Load(),
		ServingBytes:       serving,
		FetchingBytes:      fetching.bytes,
		FetchRequests:      fetching.n,
		BadSlices:          n.stats.badSlices.Load(),
		CorruptServed:      n.stats.corruptServed.Load(),
		Bans:               n.stats.bans.Load(),
		LinksAccepted:      n.stats.accepted.Load(),
		LinksDialed:        n.stats.dialed.Load(),
		AskRoundsCut:       n.stats.askCuts.Load(),
	}
}

// PeerBytes counts the blob bytes a node fetched from one peer and used
// (In: verified and written; the loser's copy of an endgame piece is not
// counted, a piece written again after a request failed part way is) and
// the bytes it served to it (Out: every range sent in full).
type PeerBytes struct{ In, Out int64 }

// maxPeerStats bounds the peers counted; bytes of more peers are counted
// only in Stats.
const maxPeerStats = 4096

func (n *Node) addPeerBytes(p peer.ID, in, out int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pb := n.perPeer[p]
	if pb == nil {
		if len(n.perPeer) >= maxPeerStats {
			return
		}
		pb = new(PeerBytes)
		n.perPeer[p] = pb
	}
	pb.In += in
	pb.Out += out
}

// PeerBytes returns the bytes moved with each peer since the node started
// (at most the first maxPeerStats peers).
func (n *Node) PeerBytes() map[peer.ID]PeerBytes {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[peer.ID]PeerBytes, len(n.perPeer))
	for p, pb := range n.perPeer {
		out[p] = *pb
	}
	return out
}

// Banned reports whether p is banned now.
func (n *Node) Banned(p peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bannedLocked(p)
}

func (n *Node) bannedLocked(p peer.ID) bool {
	until, ok := n.banned[p]
	if ok && n.cfg.Now().After(until) {
		delete(n.banned, p)
		return false
	}
	return ok
}

// ban refuses p for cfg.BanFor and closes its links, telling it why. A
// peer already banned is left as it is (slices that were in flight when the
// ban fell fail quietly).
func (n *Node) ban(p peer.ID, ev Event) {
	n.mu.Lock()
	if n.bannedLocked(p) {
		n.mu.Unlock()
		return
	}
	if len(n.banned) >= maxBanned {
		now := n.cfg.Now()
		for id, until := range n.banned {
			if now.After(until) || len(n.banned) >= maxBanned {
				delete(n.banned, id)
			}
		}
	}
	n.banned[p] = n.cfg.Now().Add(n.cfg.BanFor)
	links := append([]*link(nil), n.links[p]...)
	n.mu.Unlock()
	n.stats.bans.Add(1)
	n.record(ev)
	code := wire.CodeProtocol
	if ev.Kind == EventBadData {
		code = wire.CodeBadData
	}
	for _, l := range links {
		l.shutdown(code, ev.Detail, fmt.Errorf("%w: %s", ErrBanned, ev.Detail))
	}
}

// strike counts a protocol violation of p (its link is closing) and bans
// p at the maxStrikes-th within BanFor.
func (n *Node) strike(p peer.ID, detail string) {
	now := n.cfg.Now()
	n.mu.Lock()
	st := n.strikes[p]
	if st.n == 0 || now.Sub(st.first) > n.cfg.BanFor {
		st = strike{first: now}
	}
	st.n++
	if len(n.strikes) >= maxBanned {
		for id := range n.strikes { // any one: a bound, not a policy
			if id != p {
				delete(n.strikes, id)
				break
			}
		}
	}
	n.strikes[p] = st
	n.mu.Unlock()
	if st.n >= maxStrikes {
		n.mu.Lock()
		delete(n.strikes, p)
		n.mu.Unlock()
		n.ban(p, Event{Peer: p, Kind: EventBanned, Detail: fmt.Sprintf("%d protocol violations, the last: %s", st.n, detail)})
	}
}

// bigMTUFailed remembers, for BanFor, that big SCTP packets did not reach
// p.
func (n *Node) bigMTUFailed(p peer.ID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.smallMTU) >= maxBanned {
		for id := range n.smallMTU { // any one: a bound, not a policy
			delete(n.smallMTU, id)
			break
		}
	}
	n.smallMTU[p] = n.cfg.Now().Add(n.cfg.BanFor)
}

// bigMTUOK reports whether big packets may be tried with p.
func (n *Node) bigMTUOK(p peer.ID) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	until, ok := n.smallMTU[p]
	if ok && n.cfg.Now().After(until) {
		delete(n.smallMTU, p)
		return true
	}
	return !ok
}

// Links returns how many connections to p are open.
func (n *Node) Links(p peer.ID) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.links[p])
}

// Peers returns the peers with open connections.
func (n *Node) Peers() []peer.ID {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]peer.ID, 0, len(n.links))
	for p := range n.links {
		out = append(out, p)
	}
	return out
}

func (n *Node) linksTo(p peer.ID) []*link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*link(nil), n.links[p]...)
}

// addLink registers a ready link, or refuses it over the limits.
func (n *Node) addLink(l *link) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closed:
		return ErrClosed
	case n.bannedLocked(l.remote):
		return ErrBanned
	case len(n.links[l.remote]) >= n.cfg.MaxLinksPerPeer || n.nlinks >= n.cfg.MaxLinks:
		return ErrLimit
	case l.isClosed():
		return l.errClosed()
	}
	n.links[l.remote] = append(n.links[l.remote], l)
	n.nlinks++
	return nil
}

func (n *Node) removeLink(l *link) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ls := n.links[l.remote]
	for i, x := range ls {
		if x == l {
			n.links[l.remote] = append(ls[:i], ls[i+1:]...)
			n.nlinks--
			break
		}
	}
	if len(n.links[l.remote]) == 0 {
		delete(n.links, l.remote)
	}
}

// trackLink makes Close wait for l's goroutines.
func (n *Node) trackLink(l *link) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.allLink[l] = struct{}{}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		<-l.done
		l.wg.Wait()
		n.mu.Lock()
		delete(n.allLink, l)
		n.mu.Unlock()
	}()
	return true
}

// Close closes every connection (telling peers it is going away) and
// waits for the node's goroutines. The signaling client is the caller's.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	var all []*link
	for l := range n.allLink {
		all = append(all, l)
	}
	n.mu.Unlock()
	for _, l := range all {
		l.shutdown(wire.CodeGoingAway, "node closing", ErrClosed)
	}
	for _, l := range all {
		<-l.done
		l.wg.Wait()
	}
	n.cancel()
	n.wg.Wait()
	return nil
}

func randomSID() string {
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// punish records that p sent a slice that failed verification, bans p and
// closes its connections with the reason.
func (n *Node) punish(p peer.ID, re *cas.RangeError) {
	n.stats.badSlices.Add(1)
	n.ban(p, Event{
		Peer:   p,
		Kind:   EventBadData,
		CID:    re.CID,
		Off:    re.Off,
		Len:    re.Len,
		Detail: (&BadDataError{Peer: p, Err: re}).Error(),
	})
}
