package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

// ReplicateTopicPrefix starts the name of a swarm's replication topic:
// /rdrr/replicate/<swarm name>. Its messages say which blobs (collections
// and their shards) peers want kept in at least R live copies, and
// whether their sender replicates (keeps copies for others).
const ReplicateTopicPrefix = "/rdrr/replicate/"

// Bounds of replication messages (PROTOCOL.md section 3.2).
const (
	// MaxReplicaTargets bounds the targets of one message.
	MaxReplicaTargets = 256
	// MaxReplicas bounds R.
	MaxReplicas = 64
	replVersion = 1
	replEntry   = 1 + 1 + 32 // replicas, kind, digest
	// MaxReplicateBytes is the largest valid message.
	MaxReplicateBytes  = 1 + 1 + 2 + MaxReplicaTargets*replEntry
	replFlagReplicator = 1
)

// ErrBadReplicate: a replication message that does not decode.
var ErrBadReplicate = errors.New("p2p: malformed replication message")

// ReplicateMessage is one replication message: a version byte (1), a
// flags byte (bit 0: the sender replicates; other bits 0), the count of
// targets as a canonical unsigned varint (0..MaxReplicaTargets), then per
// target its replicas (1 byte, 1..MaxReplicas), kind (0 raw, 1
// collection) and 32-byte digest. No digest appears twice; nothing
// follows the last target.
type ReplicateMessage struct {
	Replicator bool
	Targets    []swarm.ReplicaTarget
}

// MarshalBinary encodes m.
func (m ReplicateMessage) MarshalBinary() ([]byte, error) {
	if len(m.Targets) > MaxReplicaTargets {
		return nil, fmt.Errorf("%w: %d targets; at most %d", ErrBadReplicate, len(m.Targets), MaxReplicaTargets)
	}
	var flags byte
	if m.Replicator {
		flags = replFlagReplicator
	}
	b := []byte{replVersion, flags}
	b = appendUvarint(b, uint64(len(m.Targets)))
	seen := make(map[cas.Digest]bool, len(m.Targets))
	for _, t := range m.Targets {
		if t.Replicas < 1 || t.Replicas > MaxReplicas || seen[t.CID.Digest()] {
			return nil, fmt.Errorf("%w: target %s with %d replicas (1..%d, once each)", ErrBadReplicate, t.CID, t.Replicas, MaxReplicas)
		}
		seen[t.CID.Digest()] = true
		kind := byte(haveKindRaw)
		if t.CID.IsCollection() {
			kind = haveKindCollect
		}
		b = append(b, byte(t.Replicas), kind)
		b = t.CID.AppendDigest(b)
	}
	return b, nil
}

// UnmarshalBinary decodes b strictly: anything but the canonical encoding
// of a valid message is an error wrapping ErrBadReplicate. It allocates
// at most in proportion to len(b).
func (m *ReplicateMessage) UnmarshalBinary(b []byte) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadReplicate}, args...)...)
	}
	if len(b) > MaxReplicateBytes {
		return bad("%d bytes; at most %d", len(b), MaxReplicateBytes)
	}
	if len(b) < 3 || b[0] != replVersion {
		return bad("version missing or not %d", replVersion)
	}
	if b[1]&^replFlagReplicator != 0 {
		return bad("unknown flags %#x", b[1])
	}
	n, k := uvarint(b[2:])
	if k <= 0 {
		return bad("count is not a canonical varint")
	}
	if n > MaxReplicaTargets {
		return bad("%d targets; at most %d", n, MaxReplicaTargets)
	}
	rest := b[2+k:]
	if uint64(len(rest)) != n*replEntry {
		return bad("%d bytes of targets for %d; want %d", len(rest), n, n*replEntry)
	}
	out := ReplicateMessage{Replicator: b[1]&replFlagReplicator != 0, Targets: make([]swarm.ReplicaTarget, 0, n)}
	seen := make(map[cas.Digest]bool, n)
	for i := range int(n) {
		e := rest[i*replEntry : (i+1)*replEntry]
		d := cas.Digest(e[2:])
		if e[0] < 1 || e[0] > MaxReplicas {
			return bad("target %d: %d replicas; want 1..%d", i, e[0], MaxReplicas)
		}
		if seen[d] {
			return bad("target %d repeats a digest", i)
		}
		seen[d] = true
		var c cas.CID
		switch e[1] {
		case haveKindRaw:
			c = cas.RawCID(d)
		case haveKindCollect:
			c = cas.CollectionCID(d)
		default:
			return bad("target %d has kind %d", i, e[1])
		}
		out.Targets = append(out.Targets, swarm.ReplicaTarget{CID: c, Replicas: int(e[0])})
	}
	*m = out
	return nil
}

// appendUvarint and uvarint: canonical unsigned varints.
func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func uvarint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 3; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			if i > 0 && b[i] == 0 {
				return 0, -1 // not the shortest encoding
			}
			return v, i + 1
		}
	}
	return 0, -1
}

func validReplicate(_ peer.ID, data []byte) error {
	var m ReplicateMessage
	return m.UnmarshalBinary(data)
}

// Bounds of what an Overlay keeps of replication messages.
const (
	maxReplTargets     = 1024
	maxReplicators     = 4096
	replicatorLifetime = 3 * time.Minute
	// pingTimeout bounds the liveness check of one provider.
	pingTimeout = 2 * time.Second
)

// replication is what the overlay learned on the replication topic.
type replication struct {
	mu          sync.Mutex
	targets     map[cas.Digest]swarm.ReplicaTarget
	replicators map[peer.ID]time.Time // last message that said so
}

// ReplicateTopic returns the replication topic of a swarm.
func ReplicateTopic(swarmName string) (string, error) {
	if err := signaling.CheckTopic(swarmName); err != nil {
		return "", fmt.Errorf("p2p: swarm name: %w", err)
	}
	return ReplicateTopicPrefix + swarmName, nil
}

// readReplicate keeps, bounded, the targets and replicators announced on
// the replication topic.
func (o *Overlay) readReplicate() {
	defer o.wg.Done()
	for {
		msg, err := o.repl.Next(o.ctx)
		if err != nil {
			if o.ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			continue
		}
		var m ReplicateMessage
		if m.UnmarshalBinary(msg.Data) != nil {
			continue // the validator let it through; it cannot happen
		}
		r := &o.replication
		r.mu.Lock()
		for _, t := range m.Targets {
			old, ok := r.targets[t.CID.Digest()]
			if !ok && len(r.targets) >= maxReplTargets {
				continue // full: the first targets learned are kept
			}
			if !ok || t.Replicas > old.Replicas || t.CID.IsCollection() && !old.CID.IsCollection() {
				r.targets[t.CID.Digest()] = t
			}
		}
		if m.Replicator {
			if _, ok := r.replicators[msg.From]; ok || len(r.replicators) < maxReplicators {
				r.replicators[msg.From] = time.Now()
			}
		} else {
			delete(r.replicators, msg.From)
		}
		r.mu.Unlock()
	}
}

// PublishReplication implements swarm.ReplicaOverlay: it sends targets
// (in messages of at most MaxReplicaTargets) and whether this peer
// replicates.
func (o *Overlay) PublishReplication(ctx context.Context, targets []swarm.ReplicaTarget, replicator bool) error {
	for first := true; first || len(targets) > 0; first = false {
		n := min(len(targets), MaxReplicaTargets)
		b, err := ReplicateMessage{Replicator: replicator, Targets: targets[:n]}.MarshalBinary()
		if err != nil {
			return err
		}
		if err := o.repl.Publish(ctx, b); err != nil {
			return err
		}
		targets = targets[n:]
	}
	return nil
}

// Replication implements swarm.ReplicaOverlay: the targets others
// announced, and the peers that said within the last few minutes that
// they replicate and are connected now.
func (o *Overlay) Replication() ([]swarm.ReplicaTarget, []peer.ID) {
	r := &o.replication
	r.mu.Lock()
	defer r.mu.Unlock()
	targets := make([]swarm.ReplicaTarget, 0, len(r.targets))
	for _, t := range r.targets {
		targets = append(targets, t)
	}
	var reps []peer.ID
	now := time.Now()
	for p, seen := range r.replicators {
		switch {
		case now.Sub(seen) > replicatorLifetime:
			delete(r.replicators, p)
		case o.Host.Network().Connectedness(p) == network.Connected:
			reps = append(reps, p)
		}
	}
	return targets, reps
}

// Alive implements swarm.ReplicaOverlay: those of ps that answer a
// libp2p ping within pingTimeout (all at once). Callers share pings
// (liveness): a peer asked about by many callers at once, or again
// within liveFresh of its last answer, is pinged once.
func (o *Overlay) Alive(ctx context.Context, ps []peer.ID) []peer.ID {
	live := make([]bool, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			live[i] = o.alive(ctx, p)
		}()
	}
	wg.Wait()
	var out []peer.ID
	for i, p := range ps {
		if live[i] {
			out = append(out, p)
		}
	}
	return out
}

// liveness shares pings among the callers of Alive. libp2p bounds the
// ping streams between two peers (SetDefaultServiceLimits: 3 out, 2 in,
// 4 in all), and a ping beyond them fails at once, as a dead peer's
// would: a replicator that counts the copies of eight shards at once,
// each asking about the same holders, saw most of its live holders as
// dead. So one ping per peer is in flight at a time, every caller waits
// for it, and its answer stands for liveFresh (a peer that died within
// liveFresh of answering may be counted alive once more).
type liveness struct {
	mu      sync.Mutex
	flights map[peer.ID]*pingFlight // pings in flight
	answers map[peer.ID]pingAnswer  // recent answers (at most maxLiveAnswers)
}

type pingFlight struct {
	done  chan struct{} // closed when alive is set
	alive bool
}

type pingAnswer struct {
	at    time.Time
	alive bool
}

const (
	// liveFresh is how long a ping's answer stands.
	liveFresh = 2 * time.Second
	// maxLiveAnswers bounds the answers kept (older ones are dropped
	// first).
	maxLiveAnswers = 4096
)

// alive reports whether p answers a ping: the last answer if it is
// fresh, else that of the ping in flight to p, started if there is none.
// The ping runs on the overlay's context: a caller that gives up (ctx)
// does not cut it short for the others.
func (o *Overlay) alive(ctx context.Context, p peer.ID) bool {
	lv := &o.live
	lv.mu.Lock()
	if a, ok := lv.answers[p]; ok && time.Since(a.at) < liveFresh {
		lv.mu.Unlock()
		return a.alive
	}
	f := lv.flights[p]
	if f == nil {
		if o.ctx.Err() != nil {
			lv.mu.Unlock()
			return false
		}
		if lv.flights == nil {
			lv.flights, lv.answers = map[peer.ID]*pingFlight{}, map[peer.ID]pingAnswer{}
		}
		f = &pingFlight{done: make(chan struct{})}
		lv.flights[p] = f
		o.wg.Add(1)
		go o.ping(p, f)
	}
	lv.mu.Unlock()
	select {
	case <-f.done:
		return f.alive
	case <-ctx.Done():
		return false
	}
}

// ping pings p once, within pingTimeout, and records the answer in f and
// in o.live.
func (o *Overlay) ping(p peer.ID, f *pingFlight) {
	defer o.wg.Done()
	pctx, cancel := context.WithTimeout(o.ctx, pingTimeout)
	defer cancel()
	alive := false
	select {
	case res := <-ping.Ping(pctx, o.Host, p):
		alive = res.Error == nil
	case <-pctx.Done():
	}
	lv := &o.live
	lv.mu.Lock()
	defer lv.mu.Unlock()
	delete(lv.flights, p)
	now := time.Now()
	if _, ok := lv.answers[p]; !ok {
		makeRoom(lv.answers, maxLiveAnswers, func(a pingAnswer) bool { return now.Sub(a.at) >= liveFresh })
	}
	if o.ctx.Err() == nil {
		lv.answers[p] = pingAnswer{at: now, alive: alive}
	}
	f.alive = alive
	close(f.done)
}

// LiveProviders implements swarm.ReplicaOverlay: the providers of c
// that answer a libp2p ping now. Provider records and have-announcements
// outlive the peers that made them; a ping does not. The peers of
// have-announcements are tried first; the DHT is asked (within
// liveLookup, its answer kept for lookupFresh) only when fewer than
// limit of them answer, so counting copies that are there costs no
// lookup.
func (o *Overlay) LiveProviders(ctx context.Context, c cas.CID, limit int) ([]peer.ID, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("p2p: LiveProviders: limit must be positive")
	}
	o.mu.Lock()
	announced := append([]peer.ID(nil), o.haves[c.Digest()]...)
	o.mu.Unlock()
	out := o.Alive(ctx, announced)
	if len(out) >= limit {
		return out, nil
	}
	ps, err := o.lookupProviders(ctx, c, maxHavePeers+limit)
	var more []peer.ID
	for _, p := range ps {
		if !containsPeer(announced, p) {
			more = append(more, p)
		}
	}
	out = append(out, o.Alive(ctx, more)...)
	if len(out) > 0 {
		err = nil
	}
	return out, err
}

// liveLookup bounds the DHT part of LiveProviders: a lookup that meets a
// dead peer's stale connection waits for it.
const liveLookup = 5 * time.Second

// lookupProviders is Providers within liveLookup, its answer kept for
// lookupFresh: a replicator counts every shard each pass (every second
// in tests), and a lookup that waits out liveLookup for each of them,
// each pass, made passes of 7 s, counts that lagged behind the copies
// made. The peers it found are pinged again at each use; a provider
// that appears meanwhile is announced on gossip.
func (o *Overlay) lookupProviders(ctx context.Context, c cas.CID, limit int) ([]peer.ID, error) {
	lc := &o.lookups
	lc.mu.Lock()
	if r, ok := lc.m[c.Digest()]; ok && time.Since(r.at) < lookupFresh {
		lc.mu.Unlock()
		return r.ps[:min(len(r.ps), limit)], nil
	}
	lc.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, liveLookup)
	defer cancel()
	ps, err := o.providers(lctx, c, limit, false) // a count: the whole lookup
	if ctx.Err() != nil {
		return ps, err
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.m == nil {
		lc.m = map[cas.Digest]lookupResult{}
	}
	now := time.Now()
	if _, ok := lc.m[c.Digest()]; !ok {
		makeRoom(lc.m, maxLookups, func(r lookupResult) bool { return now.Sub(r.at) >= lookupFresh })
	}
	lc.m[c.Digest()] = lookupResult{at: now, ps: ps}
	return ps, err
}

// makeRoom makes room for one more entry in m, which holds at most max:
// when full it drops the stale entries, then, if all were fresh, any ones
// (a bound, not a policy).
func makeRoom[K comparable, V any](m map[K]V, max int, stale func(V) bool) {
	if len(m) < max {
		return
	}
	for k, v := range m {
		if stale(v) {
			delete(m, k)
		}
	}
	for k := range m {
		if len(m) < max {
			break
		}
		delete(m, k)
	}
}

// lookups keeps LiveProviders' last DHT lookups (lookupProviders).
type lookups struct {
	mu sync.Mutex
	m  map[cas.Digest]lookupResult // at most maxLookups
}

type lookupResult struct {
	at time.Time
	ps []peer.ID
}

const (
	// lookupFresh is how long a lookup's answer stands.
	lookupFresh = 15 * time.Second
	// maxLookups bounds the blobs whose lookups are kept.
	maxLookups = 4096
)
