package swarm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
	"github.com/rdrr/peer/swarm/wire"
)

// Ranges fetches verified byte ranges of blobs (one expert inside a
// shard) from whichever peers hold the blob, without fetching the rest of
// it: the swarm level of the tiers cache. Safe for concurrent use.
type Ranges struct {
	Node *Node
	// Discover returns peers that may hold blobs (e.g. the members of a
	// signaling topic). Required.
	Discover func(ctx context.Context) ([]peer.ID, error)
	// RequestTimeout bounds one WANT or REQUEST (default 30 s).
	RequestTimeout time.Duration
	// Priority of the requests among the node's (default
	// PriorityDemand; a prefetching cache sets PriorityPrefetch).
	Priority Priority

	mu      sync.Mutex
	holders map[cas.CID]map[peer.ID]holder
	asked   map[cas.CID]time.Time
}

// holder is what a peer said it holds of a blob: its size, and the HAVE
// bitmap of the pieces it holds of a download in progress (nil: whole).
type holder struct {
	size int64
	bits []byte
}

// MaxSlice is the most bytes FetchSlice fetches in one call (one REQUEST).
const MaxSlice = wire.MaxRequest

// holdersTTL is how long the answers to a WANT are reused.
const holdersTTL = 30 * time.Second

// maxHolderBlobs bounds the blobs whose holders a Ranges remembers (each
// with a HAVE bitmap per peer): past it, answers older than holdersTTL
// are forgotten, then any, until there is room.
var maxHolderBlobs = 4096

// rememberLocked records got as c's holders, asked at now, within
// maxHolderBlobs. r.mu is held.
func (r *Ranges) rememberLocked(c cas.CID, got map[peer.ID]holder, now time.Time) {
	if r.holders == nil {
		r.holders, r.asked = map[cas.CID]map[peer.ID]holder{}, map[cas.CID]time.Time{}
	}
	if _, known := r.holders[c]; !known && len(r.holders) >= maxHolderBlobs {
		for old, t := range r.asked {
			if now.Sub(t) >= holdersTTL {
				delete(r.holders, old)
				delete(r.asked, old)
			}
		}
		for old := range r.holders {
			if len(r.holders) < maxHolderBlobs {
				break
			}
			delete(r.holders, old)
			delete(r.asked, old)
		}
	}
	r.holders[c], r.asked[c] = got, now
}

// FetchSlice returns the bao slice encoding of [off, off+n) of blob c of
// size bytes, verified against c, from a peer that holds the blob whole
// or, as its HAVE bitmap says, the pieces of it that cover the range (a
// peer still downloading it). A peer whose slice does not verify is
// banned (and its bytes dropped) and the next holder is tried; a peer that
// claims another size for c is not asked. The range is whole 16 KiB
// groups (off a multiple of cas.GroupSize, n too unless it ends the blob),
// as the wire protocol serves them, and at most MaxSlice bytes.
func (r *Ranges) FetchSlice(ctx context.Context, c cas.CID, size, off, n int64) ([]byte, error) {
	if off < 0 || n <= 0 || off+n > size || n > MaxSlice || size > 1<<50 || off%cas.GroupSize != 0 || (n%cas.GroupSize != 0 && off+n != size) {
		return nil, fmt.Errorf("swarm: range [%d, +%d) of a %d-byte blob (want whole %d-byte groups, at most %d bytes)", off, n, size, cas.GroupSize, MaxSlice)
	}
	timeout := r.RequestTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	holders, err := r.findHolders(ctx, c, size, timeout)
	if err != nil {
		return nil, err
	}
	// Whole holders first, then those holding the range's pieces.
	r.mu.Lock()
	var whole, part []peer.ID
	for _, p := range holders {
		switch h := r.holders[c][p]; {
		case h.bits == nil:
			whole = append(whole, p)
		case unitsHeld(h.bits, off, n):
			part = append(part, p)
		}
	}
	r.mu.Unlock()
	holders = append(whole, part...)
	if len(holders) == 0 {
		return nil, fmt.Errorf("swarm: no peer holds [%d, +%d) of %s: %w", off, n, c, cas.ErrNotFound)
	}
	start, end := bao.Cover(size, off, n)
	var cover []byte // allocated within the fetch budget
	var scratch [bao.GroupSize]byte
	var errs []error
	for _, p := range holders {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ls, err := r.Node.connectN(ctx, p, 1)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// The slice and the decoded cover are held (and allocated)
		// within the node's fetch budget; the slice returned is the
		// caller's.
		// The download cap counts the bytes the peer sends.
		if err := r.Node.fetchPace.wait(ctx, r.Priority, cas.SliceLen(size, off, n)); err != nil {
			return nil, err
		}
		held, err := r.Node.admit(ctx, r.Priority, p, cas.SliceLen(size, off, n)+end-start, nil)
		if err != nil {
			return nil, err
		}
		if cover == nil {
			cover = make([]byte, end-start)
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		slice, err := ls[0].request(rctx, c, size, off, n, nil)
		cancel()
		r.Node.prio.leave(r.Priority)
		if err != nil {
			r.Node.fetching.release(p, held)
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			r.forget(c, p)
			continue
		}
		err = bao.DecodeSlice(cover, slice, c.Digest(), size, off, n, &scratch)
		r.Node.fetching.release(p, held)
		if err != nil {
			var be *bao.Error
			re := &cas.RangeError{CID: c, Off: off, Len: n, Reason: err.Error()}
			if errors.As(err, &be) {
				re.Off, re.Len, re.Reason = be.Off, be.Len, be.Reason
			}
			r.Node.punish(p, re)
			r.forget(c, p)
			errs = append(errs, fmt.Errorf("%s: %w", p, &BadDataError{Peer: p, Err: re}))
			continue
		}
		r.Node.stats.verified(n)
		return slice, nil
	}
	return nil, fmt.Errorf("swarm: no peer served [%d, +%d) of %s: %w", off, n, c, errors.Join(append(errs, cas.ErrNotFound)...))
}

// findHolders returns the peers that said they hold c at size, in random
// order, asking the discovered peers (WANT) when the last answers are
// older than holdersTTL.
func (r *Ranges) findHolders(ctx context.Context, c cas.CID, size int64, timeout time.Duration) ([]peer.ID, error) {
	r.mu.Lock()
	if r.holders == nil {
		r.holders, r.asked = map[cas.CID]map[peer.ID]holder{}, map[cas.CID]time.Time{}
	}
	fresh := time.Since(r.asked[c]) < holdersTTL && len(r.holders[c]) > 0
	r.mu.Unlock()
	if !fresh {
		peers, err := r.Discover(ctx)
		if err != nil && len(peers) == 0 {
			return nil, err
		}
		got := map[peer.ID]holder{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, p := range peers {
			if p == r.Node.ID() || r.Node.Banned(p) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ls, err := r.Node.connectN(ctx, p, 1)
				if err != nil {
					return
				}
				rctx, cancel := context.WithTimeout(ctx, timeout)
				have, err := ls[0].want(rctx, []cas.CID{c})
				cancel()
				if err == nil && len(have) == 1 && have[0].Size <= 1<<50 {
					mu.Lock()
					got[p] = holder{size: int64(have[0].Size), bits: have[0].Bitmap}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		r.mu.Lock()
		r.rememberLocked(c, got, time.Now())
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []peer.ID
	for p, h := range r.holders[c] {
		if (h.size == size || size < 0) && !r.Node.Banned(p) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("swarm: no peer holds %s of %d bytes: %w", c, size, cas.ErrNotFound)
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out, nil
}

// FetchBlob fetches a whole small blob (a model's manifest or collection)
// of at most max bytes, verified: the size comes from the holders' HAVE
// and is proven by the verification of the last group, so a liar's size
// fails and the next claimed size is tried.
func (r *Ranges) FetchBlob(ctx context.Context, c cas.CID, max int64) ([]byte, error) {
	timeout := r.RequestTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	if _, err := r.findHolders(ctx, c, -1, timeout); err != nil {
		return nil, err
	}
	r.mu.Lock()
	sizes := map[int64]int{}
	for _, h := range r.holders[c] {
		sizes[h.size]++
	}
	r.mu.Unlock()
	var errs []error
	for size := range sizes {
		if size <= 0 || size > max {
			errs = append(errs, fmt.Errorf("a claimed size of %d bytes (at most %d)", size, max))
			continue
		}
		out := make([]byte, size)
		var err error
		for off := int64(0); off < size && err == nil; off += MaxSlice {
			n := min(MaxSlice, size-off)
			var slice []byte
			if slice, err = r.FetchSlice(ctx, c, size, off, n); err == nil {
				var scratch [bao.GroupSize]byte
				err = bao.DecodeSlice(out[off:off+n], slice, c.Digest(), size, off, n, &scratch)
			}
		}
		if err == nil {
			return out, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("swarm: fetch %s: %w", c, errors.Join(errs...))
}

// Provider is a peer that said it holds a blob, and the size it claimed.
type Provider struct {
	Peer peer.ID `json:"peer"`
	Size int64   `json:"size"`
}

// Providers asks the discovered peers (WANT) which hold c whole. The sizes
// are their claims, not yet proven. (Peers that hold pieces of it are not
// listed.)
func (r *Ranges) Providers(ctx context.Context, c cas.CID) ([]Provider, error) {
	timeout := r.RequestTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	r.mu.Lock()
	delete(r.asked, c) // a fresh answer
	r.mu.Unlock()
	if _, err := r.findHolders(ctx, c, -1, timeout); err != nil {
		if errors.Is(err, cas.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Provider
	for p, h := range r.holders[c] {
		if h.bits == nil {
			out = append(out, Provider{p, h.size})
		}
	}
	return out, nil
}

func (r *Ranges) forget(c cas.CID, p peer.ID) {
	r.mu.Lock()
	delete(r.holders[c], p)
	r.mu.Unlock()
}
