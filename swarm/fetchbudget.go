package swarm

import (
	"context"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// Fetching is bounded like serving (serve.go): a request's answer is
// assembled in a buffer of the whole slice, allocated before its REQUEST
// is sent, and kept until the slice is verified and written (or
// dropped). What a node's fetches and range fetches hold that way, over
// all of them, comes out of one budget, in bytes and in requests, with a
// share per peer: a peer that answers slowly, or never, holds at most
// its share however many fetches ask it, and a fetch that wants more
// waits for room instead of allocating.
const (
	// fetchPeerShare: one peer holds at most 1/fetchPeerShare of the
	// budget (bytes and requests).
	fetchPeerShare = 4
	// minFetchRequests lets every peer's share hold a request.
	minFetchRequests = fetchPeerShare
)

// minFetchBudget is the least Config.FetchBudget: every peer's share
// holds a request of a whole piece.
func minFetchBudget(pieceSize int) int { return fetchPeerShare * int(maxSliceLen(int64(pieceSize))) }

// maxSliceLen bounds the slice of any n-byte range of any blob
// (cas.SliceLen): the blob size, the data, and the parents that
// intersect the range, at most one per covered group plus two per tree
// level (a tree of at most 2^62 bytes has fewer than 64 levels).
func maxSliceLen(n int64) int64 {
	const group = 16 << 10
	return 8 + n + 64*((n+group-1)/group+2*64)
}

// fetchBudget bounds the requests a node has in flight and the bytes of
// their buffers (Config.FetchBudget, Config.MaxFetchRequests), in all and
// per peer. Safe for concurrent use.
type fetchBudget struct {
	bytes, peerBytes int64
	reqs, peerReqs   int

	mu     sync.Mutex
	used   int64
	n      int
	byPeer map[peer.ID]fetchUse
	freed  chan struct{} // closed and replaced when a request releases

	bufs sync.Pool // *[]byte: slice buffers, reused across requests
}

// fetchUse is what one peer's requests hold.
type fetchUse struct {
	bytes int64
	n     int
}

func newFetchBudget(bytes, reqs int) *fetchBudget {
	return &fetchBudget{
		bytes:     int64(bytes),
		peerBytes: int64(bytes / fetchPeerShare),
		reqs:      reqs,
		peerReqs:  max(1, reqs/fetchPeerShare),
		byPeer:    make(map[peer.ID]fetchUse),
		freed:     make(chan struct{}),
	}
}

// acquire waits (within ctx) until a request of n bytes to p fits both
// the total and p's share, and counts it. It returns what it counted, to
// be given back with release: a request larger than a peer's share (a
// range fetch may ask for 4 MiB) counts as the whole share, so that it
// goes alone.
func (b *fetchBudget) acquire(ctx context.Context, p peer.ID, n int64) (int64, error) {
	n = min(n, b.peerBytes)
	for {
		b.mu.Lock()
		u := b.byPeer[p]
		if b.used+n <= b.bytes && u.bytes+n <= b.peerBytes && b.n < b.reqs && u.n < b.peerReqs {
			b.used += n
			b.n++
			b.byPeer[p] = fetchUse{u.bytes + n, u.n + 1}
			b.mu.Unlock()
			return n, nil
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// release gives back a request to p that acquire counted as n bytes.
func (b *fetchBudget) release(p peer.ID, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.n--
	if u := b.byPeer[p]; u.n <= 1 {
		delete(b.byPeer, p)
	} else {
		b.byPeer[p] = fetchUse{u.bytes - n, u.n - 1}
	}
	close(b.freed)
	b.freed = make(chan struct{})
}

// held returns the bytes and requests held now, in all and by p.
func (b *fetchBudget) held(p peer.ID) (all, byPeer fetchUse) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return fetchUse{b.used, b.n}, b.byPeer[p]
}

// buffer returns an empty buffer with room for n bytes, for a request
// that acquire counted as n: a recycled one only if it is not much
// larger, so that what the budget counts is what is held.
func (b *fetchBudget) buffer(n int64) []byte {
	if p, ok := b.bufs.Get().(*[]byte); ok {
		if c := int64(cap(*p)); c >= n && c <= n+n/8 {
			return (*p)[:0]
		}
		b.bufs.Put(p)
	}
	return make([]byte, 0, n)
}

// recycle takes back a buffer that nothing refers to any more.
func (b *fetchBudget) recycle(buf []byte) {
	if cap(buf) > 0 {
		b.bufs.Put(&buf)
	}
}

// openSlots bounds the downloads (Partials) open at once over all of a
// node's fetches (Config.MaxOpenBlobs): each holds a file and its
// outboard.
type openSlots chan struct{}

// take waits (within ctx) for a slot; release gives it back.
func (s openSlots) take(ctx context.Context) error {
	select {
	case s <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s openSlots) release() { <-s }

// slotPartial is a Partial that holds one of the node's open slots until
// it is closed or finished.
type slotPartial struct {
	Partial
	once  sync.Once
	slots openSlots
}

func (p *slotPartial) Close() error {
	err := p.Partial.Close()
	p.once.Do(p.slots.release)
	return err
}

func (p *slotPartial) Finish(ctx context.Context) (info cas.Info, err error) {
	info, err = p.Partial.Finish(ctx)
	p.once.Do(p.slots.release)
	return info, err
}
