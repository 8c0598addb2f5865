//go:build !js

package cas

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdrr/peer/cas/bao"
	bolt "go.etcd.io/bbolt"
)

// Progress of a partial blob is made durable (data and outboard synced,
// then the bitmap committed) after this many new bytes or this much time.
const (
	flushBytes = 64 << 20
	flushEvery = 2 * time.Second
)

// Partial is a blob being downloaded. Each slice written to it is verified
// against the CID before any of it reaches the disk, and the set of
// verified groups survives a restart, so a download resumes where it
// stopped. The tree nodes that come with the slices are kept as the blob's
// outboard, so finishing needs no second hashing pass. A Partial is safe for
// concurrent use.
type Partial struct {
	s    *Store
	cid  CID // the first opener's CID; never changes
	size int64
	f    *os.File
	// asCol: some opener asked for the collection CID, so Finish holds the
	// blob as a collection. Set under s.pmu, read anywhere.
	asCol atomic.Bool

	mu      sync.Mutex
	have    []uint64 // bitmap of verified groups
	durable []uint64 // the groups of have made durable by the last flush that succeeded
	// syncFailures counts failed syncs of the data file (dropUndurable).
	syncFailures int
	missing      int64  // groups not yet verified
	ob           []byte // outboard assembled from the proofs
	unsynced     int64  // bytes written since the last flush
	lastSync     time.Time
	// flushing: a flush started by a write runs its syncs without mu
	// (flushOutside); idle (on mu) is signalled when it ends. What
	// changes the durable state (a flush, the record, closing the file)
	// waits for it first (waitFlush).
	flushing bool
	idle     sync.Cond
	waiters  int // in waitFlush: no write starts a flush meanwhile
	// evicted: the groups whose pages a flush has asked the kernel to
	// drop from the page cache (evictOld). Only flushOutside, one at a
	// time, reads or writes it.
	evicted []uint64
	closed  bool
	done    *Info // set when the blob was already stored at open
	refs    int   // OpenPartial calls not yet matched by Close
}

// OpenPartial opens the download of blob c of the given size, resuming an
// earlier one if there is one. If c is already stored the Partial is
// complete from the start. Several OpenPartial calls for one blob share one
// Partial; each must be matched by Close (or one Finish). A collection CID
// whose bytes are stored as raw is held as a collection at once (its bytes
// parsed and its shards linked), or refused if they do not parse.
func (s *Store) OpenPartial(c CID, size int64) (*Partial, error) {
	if size < 0 {
		return nil, fmt.Errorf("partial %s: negative size", c)
	}
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	s.pmu.Lock()
	for {
		// A download of the same blob being closed: its final flush first.
		closing := s.closing[c.Digest()]
		if closing == nil {
			break
		}
		s.pmu.Unlock()
		<-closing
		s.pmu.Lock()
	}
	defer s.pmu.Unlock()
	if s.shut {
		return nil, ErrClosed
	}
	if p := s.partials[c.Digest()]; p != nil {
		if p.size != size {
			return nil, fmt.Errorf("partial %s: size %d; a download of it with size %d is open", c, size, p.size)
		}
		if c.IsCollection() {
			// p.mu is not taken under s.pmu (Close takes them the other
			// way round).
			if s.Has(c.Raw()) {
				if _, err := s.holdAsCollection(c); err != nil {
					return nil, err
				}
			}
			p.asCol.Store(true)
		}
		p.refs++
		return p, nil
	}
	p := &Partial{s: s, cid: c, size: size, lastSync: s.opt.Now(), refs: 1}
	p.idle.L = &p.mu
	p.asCol.Store(c.IsCollection())
	inf, err := s.Stat(c.Raw())
	if err == nil && !inf.Corrupt {
		if inf.Size != size {
			return nil, fmt.Errorf("partial %s: size %d; the stored blob has %d", c, size, inf.Size)
		}
		if c.IsCollection() {
			if inf, err = s.holdAsCollection(c); err != nil {
				return nil, err
			}
		}
		p.done = &inf
		s.partials[c.Digest()] = p
		return p, nil
	}
	groups := bao.Groups(size)
	p.have = make([]uint64, (groups+63)/64)
	p.missing = groups
	p.ob = make([]byte, bao.OutboardSize(size))
	var saved []byte
	err = s.db.View(func(tx *bolt.Tx) error {
		saved = append(saved, tx.Bucket(bucketPartial).Get(c.key())...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if saved != nil {
		prev, have, err := decodePartialRecord(saved)
		switch {
		case err != nil:
			s.log.Warn("partial download record is corrupt; starting over", "cid", c, "err", err)
		case prev != size && countWords(have) > 0:
			return nil, fmt.Errorf("partial %s: size %d, but verified groups were stored for size %d", c, size, prev)
		case prev == size && countWords(have) > 0:
			if ob, err := os.ReadFile(s.partialPath(c, ".obao")); err == nil && len(ob) == len(p.ob) {
				copy(p.ob, ob)
				p.have = have
				p.missing = groups - int64(countWords(p.have))
			}
		}
	}
	f, err := os.OpenFile(s.partialPath(c, ".data"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("partial %s: %w", c, err)
	}
	p.f = f
	p.durable = slices.Clone(p.have) // a saved record's groups were synced before it
	if err := s.db.Update(func(tx *bolt.Tx) error { return p.saveBitmap(tx) }); err != nil {
		f.Close()
		return nil, err
	}
	s.partials[c.Digest()] = p
	return p, nil
}

// maxPartialSize bounds the size a partial record may claim (the bound
// on-disk offsets have anyway).
const maxPartialSize = 1 << 62

// encodePartialRecord is the index entry of a download: the blob's size
// (uint64, little-endian) and one bit per 16 KiB group, set when the group
// is verified on disk, in little-endian uint64 words (group g is bit g%64
// of word g/64); bits past the last group are zero.
func encodePartialRecord(size int64, have []uint64) []byte {
	v := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+8*len(have)), uint64(size))
	for _, w := range have {
		v = binary.LittleEndian.AppendUint64(v, w)
	}
	return v
}

// decodePartialRecord decodes what encodePartialRecord wrote. Whatever v
// holds it does not panic, and it allocates at most len(v) bytes: the size
// it accepts is the one the bitmap's length agrees with. A record that is
// not exactly that (wrong length, size out of range, bits set past the
// last group) is an error; the caller starts the download over.
func decodePartialRecord(v []byte) (size int64, have []uint64, err error) {
	if len(v) < 8 || len(v)%8 != 0 {
		return 0, nil, fmt.Errorf("partial record is %d bytes; want 8 + 8 per 64 groups", len(v))
	}
	u := binary.LittleEndian.Uint64(v)
	if u >= maxPartialSize {
		return 0, nil, fmt.Errorf("partial record claims size %d (limit %d)", u, int64(maxPartialSize))
	}
	size = int64(u)
	groups := bao.Groups(size)
	if words := (groups + 63) / 64; words != int64(len(v)/8-1) {
		return 0, nil, fmt.Errorf("partial record of size %d has %d bitmap words; want %d", size, len(v)/8-1, words)
	}
	have = make([]uint64, len(v)/8-1)
	for i := range have {
		have[i] = binary.LittleEndian.Uint64(v[8+8*i:])
	}
	if tail := groups % 64; tail != 0 && have[len(have)-1]>>tail != 0 {
		return 0, nil, fmt.Errorf("partial record of size %d marks groups past its last (%d)", size, groups-1)
	}
	return size, have, nil
}

func countWords(w []uint64) int {
	n := 0
	for _, x := range w {
		n += bits.OnesCount64(x)
	}
	return n
}

func (p *Partial) saveBitmap(tx *bolt.Tx) error {
	return tx.Bucket(bucketPartial).Put(p.cid.key(), encodePartialRecord(p.size, p.have))
}

// CID returns the blob being downloaded: its collection CID if any
// opener asked for it as a collection.
func (p *Partial) CID() CID {
	if p.asCol.Load() {
		return CollectionCID(p.cid.Digest())
	}
	return p.cid.Raw()
}

// Size returns the blob's size.
func (p *Partial) Size() int64 { return p.size }

func (p *Partial) hasGroup(g int64) bool { return p.have[g/64]&(1<<(g%64)) != 0 }

// Have reports whether every group covering [off, off+n) is verified.
func (p *Partial) Have(off, n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return true
	}
	start, end := bao.Cover(p.size, off, n)
	for g := start / GroupSize; g*GroupSize < end; g++ {
		if !p.hasGroup(g) {
			return false
		}
	}
	return true
}

// Missing returns the group-aligned ranges not yet verified, in order.
func (p *Partial) Missing() []Range {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil {
		return nil
	}
	var out []Range
	groups := bao.Groups(p.size)
	for g := int64(0); g < groups; g++ {
		if p.hasGroup(g) {
			continue
		}
		off := g * GroupSize
		end := min(off+GroupSize, p.size)
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
			out[k].Len += end - off
		} else {
			out = append(out, Range{Off: off, Len: end - off})
		}
	}
	if p.size == 0 && !p.hasGroup(0) {
		out = []Range{{0, 0}}
	}
	return out
}

// Complete reports whether every group is verified.
func (p *Partial) Complete() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done != nil || p.missing == 0
}

// WriteSlice verifies slice, the bao slice encoding of [off, off+n), against
// the CID, then writes the data of its covering groups. On a bad group it
// returns a *RangeError naming that group, and nothing of the slice is
// written. Groups already present are written again (harmlessly).
func (p *Partial) WriteSlice(off, n int64, slice []byte) error {
	return p.WriteSliceFunc(off, n, slice, nil)
}

// WriteSliceFunc is WriteSlice that also hands the verified data to fn,
// if not nil, before writing it: runs of whole groups (the blob's last
// one may be short), each with its offset in the blob, in order. data
// is part of slice: fn must not keep it. A program that writes a fetched
// file somewhere else as well (`peer get -o`) takes each group from
// here instead of reading it back and verifying it again.
func (p *Partial) WriteSliceFunc(off, n int64, slice []byte, fn func(off int64, data []byte)) error {
	p.mu.Lock()
	done, closed := p.done != nil, p.closed
	if !done && !closed && p.size == 0 {
		defer p.mu.Unlock()
		if p.cid.Digest() != Sum(nil).Digest() {
			return &RangeError{CID: p.cid, Reason: "empty blob does not hash to its CID"}
		}
		p.have[0] |= 1
		p.missing = 0
		return nil
	}
	p.mu.Unlock()
	switch {
	case done:
		return nil
	case closed:
		return ErrClosed
	}
	start, end := bao.Cover(p.size, off, n)
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	// The groups are verified in place and written from the slice, the
	// runs of them that lie together in it as one buffer (both parts of
	// slice: g starts where the last run ends when as much capacity is
	// left after the run as g has).
	iov := rb.iov[:0]
	err := bao.VerifySlice(slice, p.cid.Digest(), p.size, off, n, &rb.scratch, func(g []byte, _ int64) {
		if k := len(iov) - 1; k >= 0 && cap(iov[k])-len(iov[k]) == cap(g) {
			iov[k] = iov[k][:len(iov[k])+len(g)]
			return
		}
		iov = append(iov, g)
	})
	defer func() {
		clear(iov) // keeps no part of slice
		rb.iov = iov[:0]
	}()
	if err != nil {
		return p.s.rangeError(p.cid, err)
	}
	p.mu.Lock()
	if p.closed || p.f == nil {
		p.mu.Unlock()
		return ErrClosed
	}
	f, failures := p.f, p.syncFailures
	p.mu.Unlock()
	if fn != nil {
		// Before the write, which consumes iov.
		at := start
		for _, run := range iov {
			fn(at, run)
			at += int64(len(run))
		}
	}
	if err := writeAtv(f, iov, start); err != nil {
		return fmt.Errorf("partial %s: write: %w", p.cid, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.syncFailures != failures {
		// A sync of the data file failed while this slice was written:
		// its pages may be among those the kernel dropped. Not claimed;
		// fetched again.
		return fmt.Errorf("partial %s: %w", p.cid, errDataSync)
	}
	bao.CopySliceNodes(p.ob, slice, p.size, off, n)
	for g := start / GroupSize; g*GroupSize < end; g++ {
		if !p.hasGroup(g) {
			p.have[g/64] |= 1 << (g % 64)
			p.missing--
		}
	}
	p.unsynced += end - start
	if !p.flushing && p.waiters == 0 && (p.unsynced >= flushBytes || p.s.opt.Now().Sub(p.lastSync) >= flushEvery) {
		return p.flushOutside()
	}
	return nil
}

// flushLocked makes progress durable: data and outboard first, then the
// bitmap that claims them. p.mu must be held; it waits for a flush
// running without it first.
func (p *Partial) flushLocked() error {
	p.waitFlush()
	if p.done != nil || p.f == nil {
		return nil
	}
	have := slices.Clone(p.have)
	if err := p.persisted(have, p.persist(p.f, p.ob, encodePartialRecord(p.size, have))); err != nil {
		return err
	}
	p.unsynced = 0
	p.lastSync = p.s.opt.Now()
	return nil
}

// persisted takes in the outcome err of persisting bitmap have: on
// success have is durable; after a failed sync of the data file the
// groups not yet durable are dropped (see dropUndurable). It returns err.
// p.mu must be held.
func (p *Partial) persisted(have []uint64, err error) error {
	switch {
	case err == nil:
		p.durable = have
	case errors.Is(err, errDataSync):
		p.dropUndurable()
	}
	return err
}

// dropUndurable drops from the bitmap the groups that no flush has made
// durable: after a failed fsync of the data file the kernel may have
// dropped their pages, and a later fsync would report success without
// them. They are fetched again. p.mu must be held.
func (p *Partial) dropUndurable() {
	for i := range p.have {
		p.have[i] &= p.durable[i]
	}
	p.missing = bao.Groups(p.size) - int64(countWords(p.have))
	p.syncFailures++
}

// errDataSync marks a failed sync of a download's data file.
var errDataSync = errors.New("data sync failed")

// flushOutside is flushLocked with its syncs and writes done without
// p.mu, so that the download goes on meanwhile (its slices written, its
// groups served, its state read: a sync takes seconds on a busy disk).
// What it makes durable is what p held when it was called: a group's bit
// is set (under p.mu) only after its data's write has returned, so the
// sync after the snapshot covers every group the snapshot claims. p.mu
// must be held and no flush running; it is held again on return.
func (p *Partial) flushOutside() error {
	if p.done != nil || p.f == nil {
		return nil
	}
	have := slices.Clone(p.have)
	f, ob, rec, unsynced := p.f, slices.Clone(p.ob), encodePartialRecord(p.size, have), p.unsynced
	older := p.durable // replaced, never changed in place: read without p.mu
	p.flushing, p.unsynced = true, 0
	p.mu.Unlock()
	err := p.persist(f, ob, rec)
	if err == nil && p.s.evicts() {
		p.evictOld(f, older)
		p.s.dropCooled(maxCooledPerFlush)
	}
	p.mu.Lock()
	p.flushing = false
	p.idle.Broadcast()
	if err := p.persisted(have, err); err != nil {
		p.unsynced += unsynced // not durable: the next write flushes again
		return err
	}
	// From the end: a sync as long as flushEvery does not start the next
	// flush at once.
	p.lastSync = p.s.opt.Now()
	return nil
}

// evictOld asks the kernel to drop from the page cache the pages of the
// groups that were already durable before the flush that has just
// synced f: clean pages, written at least one flush ago. The groups of
// the last flush stay cached for the peers that ask for them while they
// are still rare. A download then holds a window of the page cache
// instead of the whole blob, so fetching a model does not push the rest
// of the machine's page cache out, and the pages the kernel frees are
// reused for the next writes instead of new ones (on a VM whose freed
// memory goes back to the host, a new page costs a fault on the host:
// 1 GiB written into new pages cost 0.7-1.2 s of system CPU here, 0.26
// s in a window). Dirty pages are never dropped. Runs without p.mu, by
// the one flush running.
func (p *Partial) evictOld(f *os.File, older []uint64) {
	if len(p.evicted) < len(older) {
		p.evicted = make([]uint64, len(older))
	}
	evictRuns(older, p.evicted, func(g, n int64) { dropPages(f, g*GroupSize, n*GroupSize) })
}

// evictRuns calls drop(g, n) for each run of groups g..g+n-1 set in
// older and not in evicted, and sets them in evicted.
func evictRuns(older, evicted []uint64, drop func(g, n int64)) {
	n := int64(len(older)) * 64
	for g := int64(0); g < n; {
		w := older[g/64] &^ evicted[g/64]
		if w>>(g%64) == 0 {
			g = (g/64 + 1) * 64
			continue
		}
		g += int64(bits.TrailingZeros64(w >> (g % 64)))
		start := g
		for g < n && older[g/64]&^evicted[g/64]&(1<<(g%64)) != 0 {
			evicted[g/64] |= 1 << (g % 64)
			g++
		}
		drop(start, g-start)
	}
}

// evicts reports whether downloads drop their pages from the page cache
// (evictOld, dropCooled): not with KeepDownloadCache, nor with NoSync
// (nothing is synced, so the pages stay dirty and cannot be dropped).
func (s *Store) evicts() bool { return !s.opt.KeepDownloadCache && !s.opt.NoSync }

// coolFor is how long a blob a download finished keeps its pages in the
// page cache: while it is new, peers that lack it ask for it.
const coolFor = 4 * time.Second

// cooling is a blob a download finished at a time.
type cooling struct {
	path string
	at   time.Time
}

// maxCooling bounds the queue of finished blobs (cool): past it the
// oldest is forgotten (left cached), so that many small downloads with
// no flush among them do not grow it without end.
const maxCooling = 1024

// cool queues the blob at path, just finished, for dropCooled.
func (s *Store) cool(path string) {
	s.cmu.Lock()
	if len(s.cooling) >= maxCooling {
		s.cooling = slices.Delete(s.cooling, 0, 1)
	}
	s.cooling = append(s.cooling, cooling{path, s.opt.Now()})
	s.cmu.Unlock()
}

// maxCooledPerFlush bounds the blobs one flush drops (dropCooled), so
// that a flush after many small blobs finished does not hold its
// download for all of them; flushes come every 2 s a download.
const maxCooledPerFlush = 4

// dropCooled drops from the page cache the pages of up to max blobs that
// downloads finished at least coolFor ago (they were synced when they
// finished): what evictOld does for a download in progress, for the
// window it left cached at its end. Called by the periodic flushes of
// the downloads still running, so a store that downloads nothing more
// keeps its last blobs cached.
func (s *Store) dropCooled(max int) {
	now := s.opt.Now()
	s.cmu.Lock()
	n := 0
	for n < len(s.cooling) && n < max && now.Sub(s.cooling[n].at) >= coolFor {
		n++
	}
	old := slices.Clone(s.cooling[:n])
	s.cooling = slices.Delete(s.cooling, 0, n)
	s.cmu.Unlock()
	for _, c := range old {
		if f, err := os.Open(c.path); err == nil {
			dropPages(f, 0, 0)
			f.Close()
		}
	}
}

// waitFlush waits until no flush runs without p.mu; while it waits, no
// write starts another. p.mu must be held.
func (p *Partial) waitFlush() {
	p.waiters++
	for p.flushing {
		p.idle.Wait()
	}
	p.waiters--
}

// persist makes f's data, the outboard ob and then the record rec (the
// bitmap that claims them) durable, in that order.
func (p *Partial) persist(f *os.File, ob, rec []byte) error {
	if err := p.s.syncFile(f); err != nil {
		return fmt.Errorf("partial %s: %w: %w", p.cid, errDataSync, err)
	}
	if err := writeFileSync(p.s, p.s.partialPath(p.cid, ".obao"), ob); err != nil {
		return fmt.Errorf("partial %s: %w", p.cid, err)
	}
	err := p.s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPartial).Put(p.cid.key(), rec) })
	if err != nil {
		return fmt.Errorf("partial %s: %w", p.cid, err)
	}
	return nil
}

// writeFileSync replaces path with b atomically and durably.
func writeFileSync(s *Store, path string, b []byte) error {
	tmp, err := s.writeTemp(b)
	if err != nil {
		return err
	}
	if err := s.fs.rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return s.syncDir(filepath.Dir(path))
}

// Close makes progress durable and releases this handle. The download can
// be resumed by a later OpenPartial.
func (p *Partial) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.releaseLocked(false)
}

// releaseLocked drops one holder, or every holder if all is set, and
// closes the Partial when none is left. p.mu must be held.
func (p *Partial) releaseLocked(all bool) error {
	p.waitFlush()
	if p.closed {
		return nil
	}
	p.s.pmu.Lock()
	p.refs--
	if all {
		p.refs = 0
	}
	last := p.refs <= 0
	var closing chan struct{}
	if last {
		// An OpenPartial of the same blob from now on waits for the
		// final flush below (OpenPartial): otherwise it could read the
		// record and outboard as they were before it, and its flushes
		// and this one could interleave their outboard and record.
		d := p.cid.Digest()
		delete(p.s.partials, d)
		closing = make(chan struct{})
		p.s.closing[d] = closing
		defer func() {
			p.s.pmu.Lock()
			delete(p.s.closing, d)
			p.s.pmu.Unlock()
			close(closing)
		}()
	}
	p.s.pmu.Unlock()
	if !last {
		return nil
	}
	p.closed = true
	if p.f == nil {
		return nil
	}
	err := p.flushLocked()
	return errors.Join(err, p.f.Close())
}

// Finish checks that every group is verified and the assembled outboard is
// consistent with the CID, then moves the blob into the store and indexes
// it. The Partial is closed afterwards, for every holder.
func (p *Partial) Finish(ctx context.Context) (Info, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waitFlush()
	if p.done != nil {
		inf := *p.done
		if c := p.CID(); c != inf.CID {
			// Another opener asked for the collection CID of these bytes
			// (OpenPartial held them as a collection).
			var err error
			if inf, err = p.s.Stat(c); err != nil {
				return Info{}, err
			}
		}
		p.releaseLocked(true)
		return inf, nil
	}
	if p.closed {
		return Info{}, ErrClosed
	}
	if p.missing > 0 {
		return Info{}, fmt.Errorf("partial %s: %d of %d groups still missing", p.cid, p.missing, bao.Groups(p.size))
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	if err := bao.VerifyTree(p.cid.Digest(), p.ob, p.size); err != nil {
		return Info{}, p.s.rangeError(p.cid, err)
	}
	c, links := p.CID(), []CID(nil)
	if c.IsCollection() {
		col, err := readCollection(p.f, p.size)
		if err != nil {
			// The bytes are the digest's, verified: no peer can send a
			// different blob, so the download is dropped.
			p.dropLocked()
			return Info{}, fmt.Errorf("partial %s: %w", c, err)
		}
		links = col.children()
	}
	if err := p.s.syncFile(p.f); err != nil {
		p.dropUndurable()
		return Info{}, fmt.Errorf("partial %s: %w: %w", p.cid, errDataSync, err)
	}
	if err := p.f.Close(); err != nil {
		return Info{}, err
	}
	p.f = nil
	// Whether this file becomes the blob (commitBlob keeps a copy already
	// stored): only then are its pages this download's to drop (cool).
	ours := !p.s.Has(c.Raw())
	inf, err := p.s.commitBlob(c, p.size, p.s.partialPath(p.cid, ".data"), p.ob, links)
	if err != nil {
		return Info{}, err
	}
	err = p.s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPartial).Delete(p.cid.key()) })
	os.Remove(p.s.partialPath(p.cid, ".data"))
	os.Remove(p.s.partialPath(p.cid, ".obao"))
	if ours && p.s.evicts() {
		p.s.cool(p.s.blobPath(c))
	}
	p.done = &inf
	p.releaseLocked(true)
	return inf, err
}

// dropLocked closes the Partial for every holder and forgets the download.
// p.mu must be held.
func (p *Partial) dropLocked() {
	p.waitFlush()
	if p.f != nil {
		p.f.Close()
		p.f = nil
	}
	p.s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPartial).Delete(p.cid.key()) })
	os.Remove(p.s.partialPath(p.cid, ".data"))
	os.Remove(p.s.partialPath(p.cid, ".obao"))
	p.releaseLocked(true)
}

// Partials lists the downloads in progress with their sizes, by raw CID
// (the index keeps downloads by digest). Corrupt records are left out;
// OpenPartial starts them over.
func (s *Store) Partials() (map[CID]int64, error) {
	out := map[CID]int64{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketPartial).ForEach(func(k, v []byte) error {
			if size, _, err := decodePartialRecord(v); len(k) == 32 && err == nil {
				out[RawCID(Digest(k))] = size
			}
			return nil
		})
	})
	return out, err
}

// PartialVerified returns the size of blob c's download in progress and a
// copy of its bitmap of verified groups (group g is bit g%64 of word
// g/64), if a download of c is open in this store. It reports false for a
// blob that is stored whole (use Stat) or not being downloaded. Safe for
// concurrent use.
func (s *Store) PartialVerified(c CID) (size int64, groups []uint64, ok bool) {
	s.pmu.Lock()
	p := s.partials[c.Digest()]
	s.pmu.Unlock()
	if p == nil {
		return 0, nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done != nil || p.closed || p.f == nil {
		return 0, nil, false
	}
	return p.size, slices.Clone(p.have), true
}

// AppendPartialSlice appends to dst the bao slice encoding of [off, off+n)
// of blob c from its download in progress: every group covering the range
// must be verified already. The groups are read back from the partial
// file and verified again against the CID, with the tree nodes that came
// with the slices that proved them, so nothing the disk changed is ever
// served (the error is then a *RangeError). A range with a group not yet
// verified, or a blob with no open download, is an error wrapping
// ErrNotFound. Safe for concurrent use; dst is not kept.
func (s *Store) AppendPartialSlice(dst []byte, c CID, off, n int64) ([]byte, error) {
	p, done, err := s.lockServable(c, off, n)
	if done {
		return s.AppendSlice(dst, c.Raw(), off, n)
	}
	if err != nil {
		return dst, err
	}
	size, f := p.size, p.f
	start, end := bao.Cover(size, off, n)
	p.mu.Unlock()
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	rb.setCover(end - start)
	// Verified groups are never rewritten with other bytes, so they are
	// read without the lock; a file closed meanwhile (the download
	// finished or stopped) fails the read.
	if err := readPartial(f, rb.cover, start, c); err != nil {
		return dst, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := bao.VerifyCover(c.Digest(), p.ob, rb.cover, size, off, n, &rb.scratch); err != nil {
		return dst, s.rangeError(c, err)
	}
	return bao.AppendSlice(dst, p.ob, rb.cover, size, off, n)
}

// AppendPartialSliceUnchecked is AppendPartialSlice without hashing the
// groups again: they were verified before they were written, and the
// receiver verifies them again (see AppendSliceUnchecked, and CheckRange
// for a range a receiver refused). The tree nodes are the download's
// own, which came with the slices that proved its groups. Safe for
// concurrent use; dst is not kept.
func (s *Store) AppendPartialSliceUnchecked(dst []byte, c CID, off, n int64) ([]byte, error) {
	p, done, err := s.lockServable(c, off, n)
	if done {
		return s.AppendSliceUnchecked(dst, c.Raw(), off, n)
	}
	if err != nil {
		return dst, err
	}
	size, f := p.size, p.f
	// The slice is laid out under the lock (the nodes are copied from
	// p.ob, which WriteSlice writes to), its data read after it into the
	// room left for it: verified groups are never rewritten with other
	// bytes, and a file closed meanwhile (the download finished or
	// stopped) fails the read.
	type run struct {
		p   []byte
		off int64
	}
	var runs []run
	orig := len(dst)
	dst, err = bao.AppendSliceAt(dst, p.ob, size, off, n, func(b []byte, at int64) error {
		runs = append(runs, run{b, at})
		return nil
	})
	p.mu.Unlock()
	if err != nil {
		return dst, err
	}
	for _, r := range runs {
		if err := readPartial(f, r.p, r.off, c); err != nil {
			return dst[:orig], err
		}
	}
	return dst, nil
}

// readPartial reads len(p) bytes at off of c's partial file f: a short
// file is a *RangeError, a file closed meanwhile (the download finished
// or stopped) an error wrapping ErrNotFound.
func readPartial(f *os.File, p []byte, off int64, c CID) error {
	err := readFull(f, p, off, c, "partial file")
	if errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("%w: %s: its download closed", ErrNotFound, c)
	}
	return err
}

// lockServable finds c's download and checks that [off, off+n) is a
// slice of it that may be served: within the blob, at most maxRead, every
// group covering it verified. On success it returns the download with
// p.mu held, for the caller to unlock. done says that the download has
// finished meanwhile (the blob is stored whole; nothing is held).
func (s *Store) lockServable(c CID, off, n int64) (p *Partial, done bool, err error) {
	if err := s.checkOpen(); err != nil {
		return nil, false, err
	}
	if p = s.openPartial(c); p == nil {
		return nil, false, notFound(c)
	}
	p.mu.Lock()
	switch {
	case p.done != nil:
		p.mu.Unlock()
		return nil, true, nil
	case p.closed || p.f == nil:
		p.mu.Unlock()
		return nil, false, notFound(c)
	case off < 0 || n <= 0 || off > p.size || n > p.size-off || n > maxRead:
		p.mu.Unlock()
		return nil, false, fmt.Errorf("blob %s: slice [%d, %d) invalid for a blob of %d bytes (at most %d bytes per slice)", c, off, off+n, p.size, maxRead)
	}
	start, end := bao.Cover(p.size, off, n)
	for g := start / GroupSize; g*GroupSize < end; g++ {
		if !p.hasGroup(g) {
			p.mu.Unlock()
			return nil, false, fmt.Errorf("%w: %s: group %d of its download is not verified yet", ErrNotFound, c, g)
		}
	}
	return p, false, nil
}

// openPartial returns the open download of c, or nil.
func (s *Store) openPartial(c CID) *Partial {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return s.partials[c.Digest()]
}

// checkRange is CheckRange for an open download: every verified group
// covering [off, off+n) is read back and verified, and those that fail
// are marked missing again. ok is false when the blob is stored whole
// (or the download closed): CheckRange then checks the stored blob.
func (p *Partial) checkRange(off, n int64) (err error, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waitFlush() // its record must not overwrite the one saved below
	if p.done != nil || p.closed || p.f == nil {
		return nil, false
	}
	if off < 0 || n <= 0 || off > p.size || n > p.size-off {
		return fmt.Errorf("partial %s: range [%d, %d) invalid for a blob of %d bytes", p.cid, off, off+n, p.size), true
	}
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	start, end := bao.Cover(p.size, off, n)
	var bad []error
	for g := start / GroupSize; g*GroupSize < end; g++ {
		if !p.hasGroup(g) {
			continue
		}
		a := g * GroupSize
		k := min(GroupSize, p.size-a)
		rb.setCover(k)
		if err := readFull(p.f, rb.cover, a, p.cid, "partial file"); err != nil {
			var re *RangeError
			if !errors.As(err, &re) {
				return err, true
			}
			bad = append(bad, err)
		} else if err := bao.VerifyCover(p.cid.Digest(), p.ob, rb.cover, p.size, a, k, &rb.scratch); err != nil {
			bad = append(bad, p.s.rangeError(p.cid, err))
		} else {
			continue
		}
		p.have[g/64] &^= 1 << (g % 64)
		p.missing++
	}
	if len(bad) == 0 {
		return nil, true
	}
	// The bitmap without the bad groups, and with those written since
	// the last flush: their data and outboard nodes are synced first.
	have := slices.Clone(p.have)
	if err := p.persisted(have, p.persist(p.f, p.ob, encodePartialRecord(p.size, have))); err != nil {
		bad = append(bad, err)
	} else {
		p.unsynced, p.lastSync = 0, p.s.opt.Now()
	}
	return errors.Join(bad...), true
}
