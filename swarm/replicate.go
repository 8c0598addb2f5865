//go:build !js

package swarm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// Self-heal: a collection pinned with R replicas is kept in at least R
// live copies of each of its shards by the members that replicate. Every
// pass, a replicator counts each shard's live holders (providers on the
// overlay that answer now, and itself); when fewer than R hold a shard,
// the replicators that do not hold it are ranked by a hash of (peer ID,
// shard), the same ranking on every peer, and the first R - holders of
// them fetch it, at background priority. When there are enough copies,
// nothing moves.

// ReplicaTarget asks for R live copies of every shard of a collection (or
// of a blob: itself).
type ReplicaTarget struct {
	CID      cas.CID
	Replicas int
}

// ReplicaOverlay is what a Replicator needs of the overlay.
// *p2p.Overlay implements it. Methods are safe for concurrent use. (Four
// methods, not three: liveness must be asked of the network, since
// records, announcements and connections outlive dead peers.)
type ReplicaOverlay interface {
	// Alive returns those of ps that answer now, within ctx.
	Alive(ctx context.Context, ps []peer.ID) []peer.ID
	// LiveProviders returns up to limit peers that announced c and are
	// reachable now (they answered within ctx).
	LiveProviders(ctx context.Context, c cas.CID, limit int) ([]peer.ID, error)
	// PublishReplication tells the swarm the targets this peer holds and
	// whether it replicates for others.
	PublishReplication(ctx context.Context, targets []ReplicaTarget, replicator bool) error
	// Replication returns the targets other peers published, and the
	// connected peers that replicate.
	Replication() ([]ReplicaTarget, []peer.ID)
}

// PinReplica is the pin reason of shards a replicator keeps for others.
const PinReplica = "replica"

// ReplicatorConfig configures a Replicator. Node, Store and Overlay are
// required.
type ReplicatorConfig struct {
	Node    *Node
	Store   *cas.Store
	Overlay ReplicaOverlay
	// Replicate: fetch and keep shards that lack copies (peer daemon
	// --replicate). Without it, a Replicator only publishes its own
	// targets and counts copies.
	Replicate bool
	// Every is the time between passes (default 30 s).
	Every time.Duration
	// Discover and Providers are passed to the fetches (FetchOptions).
	Discover  func(ctx context.Context) ([]peer.ID, error)
	Providers func(ctx context.Context, c cas.CID) ([]peer.ID, error)
	// Stored, if set, is called after a shard was fetched (for example to
	// announce it at once: Member.AnnounceSoon).
	Stored func(c cas.CID)
	Logger *slog.Logger
}

// ReplicaStatus is what the last pass counted of one target.
type ReplicaStatus struct {
	CID      string `json:"cid"`
	Replicas int    `json:"replicas"` // wanted
	Shards   int    `json:"shards"`
	// Min is the fewest live copies of any shard (-1: not counted yet).
	Min     int       `json:"min"`
	Fetched int64     `json:"fetched"` // shards this peer fetched for it
	Checked time.Time `json:"checked"`
}

// Replicator keeps replica targets. Safe for concurrent use.
type Replicator struct {
	cfg     ReplicatorConfig
	started time.Time // Run's start: no fetch before warmUp passes

	mu     sync.Mutex
	own    map[cas.Digest]ReplicaTarget // pinned here with replicas
	status map[cas.Digest]*ReplicaStatus
	// fetching: the shards being fetched (at most maxReplicaFetches);
	// fetched: how many a target got (at most maxTargets targets).
	fetching map[cas.Digest]bool
	fetched  map[cas.Digest]int64
	wg       sync.WaitGroup // the fetches
	// live: which replicators answered in this pass (alive).
	live map[peer.ID]bool
}

// maxReplicaFetches bounds the shards a replicator fetches at once. The
// fetches run beside the passes, which go on counting copies.
const maxReplicaFetches = 2

// maxTargets bounds the targets a Replicator keeps (its own and others').
const maxTargets = 1024

// countParallel bounds the shards whose live copies are counted at once.
const countParallel = 8

// maxReplicaProviders bounds the live providers counted per shard.
const maxReplicaProviders = 64

// NewReplicator makes a Replicator; Run runs it.
func NewReplicator(cfg ReplicatorConfig) (*Replicator, error) {
	if cfg.Node == nil || cfg.Store == nil || cfg.Overlay == nil {
		return nil, errors.New("swarm: replicator: Node, Store and Overlay are required")
	}
	if cfg.Every <= 0 {
		cfg.Every = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Replicator{cfg: cfg, own: map[cas.Digest]ReplicaTarget{}, status: map[cas.Digest]*ReplicaStatus{},
		fetching: map[cas.Digest]bool{}, fetched: map[cas.Digest]int64{}}, nil
}

// Pin asks for replicas live copies of every shard of c (a collection, or
// a blob) across the swarm, from now on. The caller pins c in the store.
func (r *Replicator) Pin(c cas.CID, replicas int) error {
	if replicas < 1 || replicas > 64 {
		return fmt.Errorf("swarm: replicas %d; want 1..64", replicas)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.own[c.Digest()]; !ok && len(r.own) >= maxTargets {
		return fmt.Errorf("swarm: more than %d replica targets", maxTargets)
	}
	r.own[c.Digest()] = ReplicaTarget{CID: c, Replicas: replicas}
	return nil
}

// Targets returns the targets pinned here (Pin), by CID.
func (r *Replicator) Targets() []ReplicaTarget {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ReplicaTarget, 0, len(r.own))
	for _, t := range r.own {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b ReplicaTarget) int { return bytes.Compare([]byte(a.CID.String()), []byte(b.CID.String())) })
	return out
}

// Status returns what the last passes counted, by target.
func (r *Replicator) Status() []ReplicaStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ReplicaStatus, 0, len(r.status))
	for _, s := range r.status {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b ReplicaStatus) int { return bytes.Compare([]byte(a.CID), []byte(b.CID)) })
	return out
}

// warmUp is how many passes a replicator only counts before it fetches:
// until it has heard the other replicators (each publishes every pass),
// its ranking would differ from theirs and it would fetch copies that
// they fetch too.
const warmUp = 3

// Run makes a pass every Every until ctx ends, and returns once the
// fetches it started have ended.
func (r *Replicator) Run(ctx context.Context) {
	r.mu.Lock()
	r.started = time.Now()
	r.mu.Unlock()
	defer r.wg.Wait()
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	for {
		r.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// targets returns this peer's targets and the others' (the higher R for
// one digest), and the replicators.
func (r *Replicator) targets() (own, all []ReplicaTarget, replicators []peer.ID) {
	others, reps := r.cfg.Overlay.Replication()
	r.mu.Lock()
	byDigest := map[cas.Digest]ReplicaTarget{}
	for _, t := range r.own {
		own = append(own, t)
		byDigest[t.CID.Digest()] = t
	}
	r.mu.Unlock()
	for _, t := range others {
		if len(byDigest) >= maxTargets {
			break
		}
		if old, ok := byDigest[t.CID.Digest()]; !ok || t.Replicas > old.Replicas {
			if ok && old.CID.IsCollection() {
				t.CID = old.CID
			}
			byDigest[t.CID.Digest()] = t
		}
	}
	for _, t := range byDigest {
		all = append(all, t)
	}
	return own, all, reps
}

// pass publishes this peer's targets and, for each target, counts the
// live copies of its shards and fetches those it is chosen for.
func (r *Replicator) pass(ctx context.Context) {
	r.mu.Lock()
	r.live = nil // asked again each pass
	r.mu.Unlock()
	own, all, reps := r.targets()
	if err := r.cfg.Overlay.PublishReplication(ctx, own, r.cfg.Replicate); err != nil && ctx.Err() == nil {
		r.cfg.Logger.Debug("swarm: replication: publish", "err", err)
	}
	for _, t := range all {
		if ctx.Err() != nil {
			return
		}
		r.keep(ctx, t, reps)
	}
}

// keep counts the copies of t's shards and fetches those this peer is
// chosen for.
func (r *Replicator) keep(ctx context.Context, t ReplicaTarget, replicators []peer.ID) {
	shards, err := r.shards(ctx, t.CID)
	// The status of the last complete pass stays until this one is done.
	st := ReplicaStatus{CID: t.CID.String(), Replicas: t.Replicas, Min: -1}
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		old := r.status[t.CID.Digest()]
		if old == nil && len(r.status) >= maxTargets {
			return
		}
		if old != nil {
			if st.Min < 0 {
				st.Min, st.Shards = old.Min, old.Shards // this pass counted nothing
			}
		}
		st.Fetched = r.fetched[t.CID.Digest()]
		st.Checked = time.Now()
		r.status[t.CID.Digest()] = &st
	}()
	if err != nil {
		r.cfg.Logger.Debug("swarm: replication: shards", "cid", t.CID, "err", err)
		return
	}
	self := r.cfg.Node.ID()
	// The shards' copies are counted at once (a ping to a dead holder
	// waits for its timeout: one after the other, a pass over a 1 GiB
	// collection's sixteen shards would take minutes), at most
	// countParallel at a time.
	live := make([][]peer.ID, len(shards))
	sem := make(chan struct{}, countParallel)
	var wg sync.WaitGroup
	for i, sh := range shards {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			// One more than asked: this peer may be among them.
			live[i], _ = r.cfg.Overlay.LiveProviders(ctx, sh.CID, min(t.Replicas+1, maxReplicaProviders))
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	minCopies := -1
	for i, sh := range shards {
		holders := slices.DeleteFunc(live[i], func(p peer.ID) bool { return p == self })
		have := r.stored(sh.CID)
		if have {
			holders = append(holders, self)
		}
		if minCopies < 0 || len(holders) < minCopies {
			minCopies = len(holders)
		}
		r.mu.Lock()
		warm := time.Since(r.started) >= warmUp*r.cfg.Every
		r.mu.Unlock()
		if !r.cfg.Replicate || !warm || have || len(holders) >= t.Replicas {
			continue // enough, or not ours to fix (yet)
		}
		if _, _, busy := r.cfg.Store.PartialVerified(sh.CID); busy {
			continue // a fetch of this node is getting it: a copy is coming
		}
		if !r.chosen(ctx, sh.CID, t.Replicas-len(holders), replicators, holders) {
			continue
		}
		// From the live holders just counted: a lookup now would find
		// the dead ones again and wait for them. If they fail, a later
		// pass counts again.
		r.startFetch(ctx, t, sh.CID, len(holders), slices.DeleteFunc(slices.Clone(holders), func(p peer.ID) bool { return p == self }))
	}
	if ctx.Err() == nil {
		st.Min, st.Shards = minCopies, len(shards)
	}
}

// startFetch fetches shard c of target t from the peers from, in the
// background, unless it is being fetched already or maxReplicaFetches
// are: the passes go on counting copies meanwhile (a fetch at background
// priority waits while this node fetches what someone waits for).
func (r *Replicator) startFetch(ctx context.Context, t ReplicaTarget, c cas.CID, live int, from []peer.ID) {
	r.mu.Lock()
	if r.fetching[c.Digest()] || len(r.fetching) >= maxReplicaFetches {
		r.mu.Unlock()
		return
	}
	r.fetching[c.Digest()] = true
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() {
			r.mu.Lock()
			delete(r.fetching, c.Digest())
			r.mu.Unlock()
		}()
		r.cfg.Logger.Info("replicating", "cid", c, "of", t.CID, "live", live, "want", t.Replicas)
		began := time.Now()
		_, err := r.cfg.Node.Fetch(ctx, r.cfg.Store, c, FetchOptions{
			Peers:       from,
			Priority:    PriorityBackground,
			FindTimeout: r.cfg.Every,
		})
		if err != nil {
			r.cfg.Logger.Warn("swarm: replication: fetch", "cid", c, "err", err)
			return
		}
		if err := r.cfg.Store.Pin(c, PinReplica); err != nil {
			r.cfg.Logger.Warn("swarm: replication: pin", "cid", c, "err", err)
		}
		if r.cfg.Stored != nil {
			r.cfg.Stored(c)
		}
		r.cfg.Logger.Info("replicated", "cid", c, "in", time.Since(began).Round(time.Millisecond))
		r.mu.Lock()
		if _, ok := r.fetched[t.CID.Digest()]; ok || len(r.fetched) < maxTargets {
			r.fetched[t.CID.Digest()]++
		}
		r.mu.Unlock()
	}()
}

// stored reports whether c is in the store, whole and sound.
func (r *Replicator) stored(c cas.CID) bool {
	inf, err := r.cfg.Store.Stat(c)
	return err == nil && !inf.Corrupt
}

// shards returns the blobs whose copies t's CID asks for: a collection's
// shards (its list is fetched first if it is not here), or the blob.
func (r *Replicator) shards(ctx context.Context, c cas.CID) ([]cas.Shard, error) {
	if !c.IsCollection() {
		return []cas.Shard{{CID: c}}, nil
	}
	if col, err := r.cfg.Store.Collection(c); err == nil {
		return col.Shards, nil
	}
	// The list alone, as a raw blob: fetching the collection CID would
	// fetch every shard.
	raw := c.Raw()
	if !r.stored(raw) {
		if _, err := r.cfg.Node.Fetch(ctx, r.cfg.Store, raw, FetchOptions{Discover: r.cfg.Discover, Providers: r.cfg.Providers, Priority: PriorityBackground, MaxBlobSize: 128 << 20}); err != nil {
			return nil, err
		}
	}
	rd, err := r.cfg.Store.Open(raw)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	if rd.Size() > 128<<20 {
		return nil, fmt.Errorf("swarm: collection %s is %d bytes", c, rd.Size())
	}
	b := make([]byte, rd.Size())
	if _, err := rd.ReadAt(b, 0); err != nil && len(b) > 0 {
		return nil, err
	}
	col, err := cas.ParseCollection(b)
	if err != nil {
		return nil, err
	}
	return col.Shards, nil
}

// maxAhead bounds the replicators ranked ahead of this one that are
// checked for life: with more ahead, enough of them are taken to be alive.
const maxAhead = 16

// chosen reports whether this peer is among the first need live
// replicators that do not hold c (see rank).
func (r *Replicator) chosen(ctx context.Context, c cas.CID, need int, replicators, holders []peer.ID) bool {
	self := r.cfg.Node.ID()
	ahead := rankAhead(self, c, replicators, holders)
	if need <= 0 || len(ahead) >= need+maxAhead {
		return false
	}
	if len(ahead) < need {
		return true
	}
	// A replicator that died is still listed (its connection, its last
	// message) for a while: only live ones count.
	return len(r.alive(ctx, ahead)) < need
}

// alive returns those of ps that answer, asking the overlay only about
// peers not asked yet in this pass: a dead replicator is waited for once
// a pass, not once per shard.
func (r *Replicator) alive(ctx context.Context, ps []peer.ID) []peer.ID {
	r.mu.Lock()
	if r.live == nil {
		r.live = map[peer.ID]bool{}
	}
	var ask []peer.ID
	for _, p := range ps {
		if _, ok := r.live[p]; !ok {
			ask = append(ask, p)
		}
	}
	r.mu.Unlock()
	answered := r.cfg.Overlay.Alive(ctx, ask)
	r.mu.Lock()
	defer r.mu.Unlock()
	if ctx.Err() == nil {
		for _, p := range ask {
			r.live[p] = slices.Contains(answered, p)
		}
	}
	var out []peer.ID
	for _, p := range ps {
		if r.live[p] || slices.Contains(answered, p) {
			out = append(out, p)
		}
	}
	return out
}

// rankAhead ranks self and the replicators that do not hold c by SHA-256
// of (peer ID, digest) and returns those ranked ahead of self: every peer
// that sees the same replicators and holders ranks them alike, so a
// missing copy is fetched by the first ones, not by everyone.
func rankAhead(self peer.ID, c cas.CID, replicators, holders []peer.ID) []peer.ID {
	cands := []peer.ID{self}
	for _, p := range replicators {
		if p != self && !slices.Contains(holders, p) && !slices.Contains(cands, p) {
			cands = append(cands, p)
		}
	}
	rank := func(p peer.ID) []byte {
		h := sha256.New()
		h.Write([]byte(p))
		d := c.Digest()
		h.Write(d[:])
		return h.Sum(nil)
	}
	slices.SortFunc(cands, func(a, b peer.ID) int { return bytes.Compare(rank(a), rank(b)) })
	return cands[:slices.Index(cands, self)]
}
