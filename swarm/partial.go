package swarm

import (
	"context"
	"math/bits"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// Every peer serves what it has verified: a node whose Source is also a
// PartialSource answers REQUESTs for the groups it has verified of the
// blobs it is downloading, tells peers that speak CapPartial which 1 MiB
// pieces it holds (in its answers to their WANTs, and in HAVE
// announcements as pieces complete), and its fetches take pieces from
// such peers as they announce them (PROTOCOL.md, HAVE).

// PartialSource is a Source that also serves the verified part of the
// blobs it is downloading. *cas.Store implements it.
type PartialSource interface {
	// PartialVerified returns the size of blob c's download in progress
	// and a copy of its bitmap of verified 16 KiB groups (group g is bit
	// g%64 of word g/64); false if none is open. Safe for concurrent use.
	PartialVerified(c cas.CID) (size int64, groups []uint64, ok bool)
	// AppendPartialSlice appends to dst the bao slice of [off, off+n) of
	// the download of c, every covering group verified already and
	// verified again while read; an error wrapping cas.ErrNotFound when
	// a group is not verified or the download is not open. Safe for
	// concurrent use; dst is not kept.
	AppendPartialSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error)
}

// Have-announcements on the data channels: what changed is sent at most
// this often, in HAVEs of at most maxAnnounce entries pending.
const (
	haveEvery   = 50 * time.Millisecond
	maxAnnounce = 4096
	// haveSendTimeout bounds the write of one announcement to one peer: a
	// peer that does not read its control channel misses it.
	haveSendTimeout = 2 * time.Second
	// maxRetractBitmap bounds the empty bitmap of a retraction (a blob
	// of up to 8 GiB; shards are 64 MiB).
	maxRetractBitmap = 1 << 10
)

// unitBitmap returns the HAVE bitmap (bit i: bytes [i MiB, (i+1) MiB) held,
// LSB first) of a blob of size bytes whose verified groups are groups, and
// whether any bit is set.
func unitBitmap(size int64, groups []uint64) ([]byte, bool) {
	bm := make([]byte, wire.BitmapLen(uint64(size)))
	const per = wire.PieceUnit / cas.GroupSize // groups per unit: 64, one word
	any := false
	for u := int64(0); u*wire.PieceUnit < size; u++ {
		first := u * per
		last := min(first+per, (size+cas.GroupSize-1)/cas.GroupSize) // exclusive
		ok := last > first
		for g := first; g < last && ok; g++ {
			w := g / 64
			ok = w < int64(len(groups)) && groups[w]&(1<<(g%64)) != 0
		}
		if ok {
			bm[u/8] |= 1 << (u % 8)
			any = true
		}
	}
	return bm, any
}

// PieceBitmap returns the HAVE bitmap (PROTOCOL.md, HAVE: bit i, LSB
// first, for bytes [i MiB, (i+1) MiB)) of a download of size bytes whose
// verified 16 KiB groups are groups, as PartialSource.PartialVerified
// returns them: the pieces a node announces and serves of it.
func PieceBitmap(size int64, groups []uint64) []byte {
	bm, _ := unitBitmap(size, groups)
	return bm
}

// unitsHeld reports whether bitmap bm (of a blob of size bytes) holds
// every piece covering [off, off+n). Bits past the bitmap are not held.
func unitsHeld(bm []byte, off, n int64) bool {
	if off < 0 || n <= 0 {
		return false
	}
	for u := off / wire.PieceUnit; u*wire.PieceUnit < off+n; u++ {
		if u/8 >= int64(len(bm)) || bm[u/8]&(1<<(u%8)) == 0 {
			return false
		}
	}
	return true
}

// unitsCover reports whether bm has every bit that old has.
func unitsCover(bm, old []byte) bool {
	for i, o := range old {
		if i >= len(bm) && o != 0 || i < len(bm) && bm[i]&o != o {
			return false
		}
	}
	return true
}

// countUnits returns how many bits bm has set.
func countUnits(bm []byte) int {
	n := 0
	for _, b := range bm {
		n += bits.OnesCount8(b)
	}
	return n
}

// partialSource returns the node's Source as a PartialSource, if it is
// one.
func (n *Node) partialSource() (PartialSource, bool) {
	ps, ok := n.cfg.Source.(PartialSource)
	return ps, ok
}

// servablePartial returns the size of c's download in progress if every
// group covering [off, off+n) of it is verified here.
func (n *Node) servablePartial(c cas.CID, off, length uint64) (int64, bool) {
	ps, ok := n.partialSource()
	if !ok {
		return 0, false
	}
	size, groups, ok := ps.PartialVerified(c)
	if !ok || length == 0 || off >= uint64(size) || length > uint64(size)-off {
		return size, false
	}
	for g := off / cas.GroupSize; g*cas.GroupSize < off+length; g++ {
		if w := g / 64; w >= uint64(len(groups)) || groups[w]&(1<<(g%64)) == 0 {
			return size, false
		}
	}
	return size, true
}

// partialEntry returns the HAVE entry of c's download in progress, if it
// holds a piece.
func (n *Node) partialEntry(c cas.CID) (wire.HaveEntry, bool) {
	ps, ok := n.partialSource()
	if !ok {
		return wire.HaveEntry{}, false
	}
	size, groups, ok := ps.PartialVerified(c)
	if !ok {
		return wire.HaveEntry{}, false
	}
	bm, any := unitBitmap(size, groups)
	return wire.HaveEntry{CID: c.Raw(), Size: uint64(size), Bitmap: bm}, any
}

// markHave queues c for the next have-announcement: a piece of it was
// written, or it was finished.
func (n *Node) markHave(c cas.CID) { n.queueHave(c, -1) }

// retract queues c, a blob of size bytes whose download was closed
// unfinished, for the next have-announcement: unless it is held whole or
// open in another download by then, the announcement is an empty bitmap,
// so that peers stop asking for the pieces announced before (a peer that
// refuses pieces it announced is taken for a liar: fetch.go, broke).
func (n *Node) retract(c cas.CID, size int64) {
	if size >= 0 {
		n.queueHave(c, size)
	}
}

func (n *Node) queueHave(c cas.CID, size int64) {
	if _, ok := n.partialSource(); !ok {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	old, ok := n.haveDirty[c.Raw()]
	if !ok && len(n.haveDirty) >= maxAnnounce {
		return
	}
	n.haveDirty[c.Raw()] = max(old, size)
	if !n.haveLoop {
		n.haveLoop = true
		n.wg.Add(1)
		go n.announceLoop()
	}
}

// announceLoop sends, every haveEvery, a HAVE (req 0) with what changed to
// every peer that speaks CapPartial: blobs held whole, and the pieces of
// downloads in progress.
func (n *Node) announceLoop() {
	defer n.wg.Done()
	t := time.NewTicker(haveEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		dirty := n.haveDirty
		n.haveDirty = make(map[cas.CID]int64)
		n.mu.Unlock()
		if len(dirty) == 0 {
			continue
		}
		var entries []wire.HaveEntry
		for c, size := range dirty {
			if inf, err := n.cfg.Source.Stat(c); err == nil && !inf.Corrupt {
				entries = append(entries, wire.HaveEntry{CID: c, Size: uint64(inf.Size)})
			} else if e, ok := n.partialEntry(c); ok {
				entries = append(entries, e)
			} else if size >= 0 && wire.BitmapLen(uint64(size)) <= maxRetractBitmap {
				// Retracted (a download closed unfinished): nothing held.
				entries = append(entries, wire.HaveEntry{CID: c, Size: uint64(size), Bitmap: make([]byte, wire.BitmapLen(uint64(size)))})
			}
		}
		if len(entries) == 0 {
			continue
		}
		for _, p := range n.Peers() {
			ls := n.linksTo(p)
			if len(ls) == 0 || ls[0].peerHello().Caps&wire.CapPartial == 0 {
				continue
			}
			ls[0].announce(entries)
		}
	}
}

// announce sends entries as HAVEs (req 0) that fit the peer's frames.
func (l *link) announce(entries []wire.HaveEntry) {
	limit := int(min(l.peerHello().MaxFrame, wire.MaxFrame))
	for len(entries) > 0 {
		k := 0
		for size := wire.HaveLen(nil); k < len(entries) && k < 1<<16-1; k++ {
			e := wire.HaveLen(entries[k : k+1])
			if size+e-wire.HaveLen(nil) > limit {
				break
			}
			size += e - wire.HaveLen(nil)
		}
		if k == 0 {
			return // an entry larger than a frame: a blob past any real size
		}
		ctx, cancel := context.WithTimeout(l.ctx, haveSendTimeout)
		err := l.ctl.write(ctx, wire.AppendHave(nil, 0, entries[:k]))
		cancel()
		if err != nil {
			return
		}
		entries = entries[k:]
	}
}

// announced takes a HAVE announcement (req 0) from p to the fetches in
// progress. The entries alias a frame buffer: they are copied.
func (n *Node) announced(p peer.ID, entries []wire.HaveEntry) {
	n.mu.Lock()
	fetches := make([]*fetcher, 0, len(n.fetches))
	for f := range n.fetches {
		fetches = append(fetches, f)
	}
	n.mu.Unlock()
	if len(fetches) == 0 || len(entries) == 0 {
		return
	}
	own := make([]wire.HaveEntry, len(entries))
	for i, e := range entries {
		own[i] = wire.HaveEntry{CID: e.CID, Size: e.Size, Bitmap: slices.Clone(e.Bitmap)}
	}
	for _, f := range fetches {
		f.peerHas(p, own)
	}
}

// trackFetch lets announcements reach f while it runs; the returned func
// stops that.
func (n *Node) trackFetch(f *fetcher) func() {
	n.mu.Lock()
	n.fetches[f] = struct{}{}
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		delete(n.fetches, f)
		n.mu.Unlock()
	}
}
