package browser

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/bits"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
	"github.com/rdrr/peer/swarm"
	"github.com/rdrr/peer/swarm/wire"
	"github.com/zeebo/blake3"
)

// Files of a blob, by the hex of its digest: "<hex>.m" its record (size,
// whole or not, and for a download the bitmap of verified groups), "<hex>.o"
// its outboard, "<hex>.p<i>" the bytes of its piece i (1 MiB). A record
// is written after the pieces and the outboard it claims, so storage
// interrupted at any point claims nothing that was not verified and kept.
const (
	pieceSize = wire.PieceUnit
	groupSize = cas.GroupSize
	// maxSlice bounds one read or write: the largest REQUEST.
	maxSlice = wire.MaxRequest
	// recordMagic opens a record (8 bytes).
	recordMagic = "rdrrweb1"
)

// ErrFull: a blob does not fit the store's budget, even after evicting
// every blob that can be.
var ErrFull = errors.New("browser store: over its byte budget")

// Options configure a Store. The zero value is usable.
type Options struct {
	// Budget bounds the bytes of blobs kept, downloads in progress
	// counted at their full size; least recently used whole blobs are
	// evicted to make room (default 1 GiB).
	Budget int64
	// FlushBytes: a download's progress (outboard, then record) is made
	// durable after this many new bytes (default 8 MiB), at least every 2
	// s while it is written, and when it is closed.
	FlushBytes int64
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Store is a browser peer's store: blobs kept in the page's storage
// (Files) under a byte budget, every group verified against its CID before
// it is kept and again when it is read. It is a swarm.Store (a fetch
// writes to it) and a swarm.PartialSource (the page serves what it holds,
// downloads in progress included). Safe for concurrent use.
type Store struct {
	files Files
	opt   Options

	mu    sync.Mutex
	blobs map[cas.Digest]*blob
	used  int64 // sizes of every blob, downloads at their full size
	tick  uint64
}

// blob is one blob, whole or in progress. Fields are guarded by Store.mu
// except wmu and fmu.
type blob struct {
	cid      cas.CID // raw
	size     int64
	complete bool
	have     []uint64 // download: verified groups
	missing  int64    // download: groups not verified
	ob       []byte   // outboard (a download's: the nodes of its slices)
	last     uint64   // LRU stamp
	refs     int      // open Partials
	gone     bool     // evicted or deleted
	unsynced int64
	flushed  time.Time

	wmu sync.Mutex // piece writes (a piece written in part is read, merged, written)
	fmu sync.Mutex // flushes, so that a later snapshot is never overwritten by an earlier
}

var (
	_ swarm.Store         = (*Store)(nil)
	_ swarm.PartialSource = (*Store)(nil)
)

// Open reads the records in files and returns their Store. Records that do
// not decode, outboards that do not match their record or (for whole
// blobs) their CID, and pieces no record claims are removed: storage
// changed outside the Store keeps nothing that cannot be proven.
func Open(ctx context.Context, files Files, opt Options) (*Store, error) {
	if opt.Budget <= 0 {
		opt.Budget = 1 << 30
	}
	if opt.FlushBytes <= 0 {
		opt.FlushBytes = 8 << 20
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	s := &Store{files: files, opt: opt, blobs: map[cas.Digest]*blob{}}
	names, err := files.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("browser store: list: %w", err)
	}
	byBlob := map[string][]string{}
	for _, n := range names {
		h, _, ok := strings.Cut(n, ".")
		if !ok {
			continue // not ours
		}
		byBlob[h] = append(byBlob[h], n)
	}
	keys := make([]string, 0, len(byBlob))
	for h := range byBlob {
		keys = append(keys, h)
	}
	sort.Strings(keys)
	for _, h := range keys {
		b, err := s.load(ctx, h)
		if err != nil {
			for _, n := range byBlob[h] {
				files.Remove(ctx, n)
			}
			continue
		}
		s.blobs[b.cid.Digest()] = b
		s.used += b.size
		// Pieces past the blob's end are not its: drop them.
		for _, n := range byBlob[h] {
			if i, ok := pieceIndex(n); ok && i >= pieces(b.size) {
				files.Remove(ctx, n)
			}
		}
	}
	return s, nil
}

// load reads the record and outboard of the blob of hex digest h.
func (s *Store) load(ctx context.Context, h string) (*blob, error) {
	raw, err := hex.DecodeString(h)
	if err != nil || len(raw) != 32 {
		return nil, fmt.Errorf("%q is not a digest", h)
	}
	c := cas.RawCID(cas.Digest(raw))
	rec, err := s.files.Read(ctx, h+".m", 0, int64(len(recordMagic))+9+8*((maxRecordGroups+63)/64))
	if err != nil {
		return nil, err
	}
	size, complete, have, err := decodeRecord(rec)
	if err != nil {
		return nil, err
	}
	if size > s.opt.Budget {
		// Nothing over the budget was ever kept: the record was changed
		// (and its outboard would be read whole).
		return nil, fmt.Errorf("record of %s claims %d bytes, over the budget %d", c, size, s.opt.Budget)
	}
	b := &blob{cid: c, size: size, complete: complete, have: have, flushed: s.opt.Now()}
	ob, err := s.files.Read(ctx, h+".o", 0, bao.OutboardSize(size))
	switch {
	case errors.Is(err, fs.ErrNotExist) && !complete:
		ob = make([]byte, bao.OutboardSize(size))
		binary.LittleEndian.PutUint64(ob, uint64(size))
		clear(b.have)
	case err != nil:
		return nil, err
	case int64(len(ob)) != bao.OutboardSize(size) || binary.LittleEndian.Uint64(ob) != uint64(size):
		return nil, fmt.Errorf("outboard of %s does not match its size %d", c, size)
	}
	b.ob = ob
	if complete {
		if err := bao.VerifyTree(c.Digest(), ob, size); err != nil {
			return nil, err
		}
	} else {
		b.missing = bao.Groups(size) - int64(countBits(b.have))
	}
	return b, nil
}

// maxRecordGroups bounds the size a record may claim: 1 TiB.
const maxRecordGroups = 1 << 26

// encodeRecord: magic, size (uint64 LE), 1 if whole else 0, and for a
// download its bitmap of verified groups in uint64 LE words (group g is
// bit g%64 of word g/64).
func encodeRecord(size int64, complete bool, have []uint64) []byte {
	v := append([]byte(recordMagic), make([]byte, 9)...)
	binary.LittleEndian.PutUint64(v[len(recordMagic):], uint64(size))
	if complete {
		v[len(recordMagic)+8] = 1
		return v
	}
	for _, w := range have {
		v = binary.LittleEndian.AppendUint64(v, w)
	}
	return v
}

// decodeRecord decodes what encodeRecord wrote, strictly: whatever v holds
// it allocates at most len(v) bytes and does not panic.
func decodeRecord(v []byte) (size int64, complete bool, have []uint64, err error) {
	h := len(recordMagic)
	if len(v) < h+9 || string(v[:h]) != recordMagic {
		return 0, false, nil, errors.New("not a blob record")
	}
	u := binary.LittleEndian.Uint64(v[h:])
	if u > maxRecordGroups*groupSize {
		return 0, false, nil, fmt.Errorf("record claims %d bytes", u)
	}
	size = int64(u)
	switch v[h+8] {
	case 1:
		if len(v) != h+9 {
			return 0, false, nil, errors.New("record of a whole blob has trailing bytes")
		}
		return size, true, nil, nil
	case 0:
	default:
		return 0, false, nil, fmt.Errorf("record state %d", v[h+8])
	}
	groups := bao.Groups(size)
	words := (groups + 63) / 64
	if int64(len(v)-h-9) != 8*words {
		return 0, false, nil, fmt.Errorf("record of %d bytes has %d bitmap bytes; want %d", size, len(v)-h-9, 8*words)
	}
	have = make([]uint64, words)
	for i := range have {
		have[i] = binary.LittleEndian.Uint64(v[h+9+8*i:])
	}
	if tail := groups % 64; tail != 0 && have[words-1]>>tail != 0 {
		return 0, false, nil, errors.New("record marks groups past the blob's end")
	}
	return size, false, have, nil
}

func countBits(w []uint64) int {
	n := 0
	for _, x := range w {
		n += bits.OnesCount64(x)
	}
	return n
}

func pieces(size int64) int64 { return max(1, (size+pieceSize-1)/pieceSize) }

func pieceName(c cas.CID, i int64) string {
	return c.Hex() + ".p" + strconv.FormatInt(i, 10)
}

func pieceIndex(name string) (int64, bool) {
	_, p, ok := strings.Cut(name, ".p")
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(p, 10, 64)
	return i, err == nil && i >= 0
}

// rangeError turns a bao verification failure into the *cas.RangeError
// that names the blob and the bytes.
func rangeError(c cas.CID, err error) error {
	var be *bao.Error
	if errors.As(err, &be) {
		return &cas.RangeError{CID: c, Off: be.Off, Len: be.Len, Reason: be.Reason}
	}
	return err
}

func notFound(c cas.CID) error { return fmt.Errorf("%w: %s", cas.ErrNotFound, c) }

// Stat returns what is known of c if it is held whole, else an error
// wrapping cas.ErrNotFound. Safe for concurrent use.
func (s *Store) Stat(c cas.CID) (cas.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blobs[c.Digest()]
	if b == nil || !b.complete {
		return cas.Info{}, notFound(c)
	}
	return cas.Info{CID: c, Size: b.size, Collection: c.IsCollection()}, nil
}

// Partials returns the downloads in progress with their sizes, by raw CID.
func (s *Store) Partials() (map[cas.CID]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[cas.CID]int64{}
	for _, b := range s.blobs {
		if !b.complete {
			out[b.cid] = b.size
		}
	}
	return out, nil
}

// BlobInfo is one blob as the page lists it.
type BlobInfo struct {
	CID      cas.CID `json:"cid"`
	Size     int64   `json:"size"`
	Verified int64   `json:"verified"` // bytes verified and kept
	Whole    bool    `json:"whole"`
}

// Blobs lists what the store holds, whole or in part, by CID.
func (s *Store) Blobs() []BlobInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]BlobInfo, 0, len(s.blobs))
	for _, b := range s.blobs {
		inf := BlobInfo{CID: b.cid, Size: b.size, Whole: b.complete, Verified: b.size}
		if !b.complete {
			inf.Verified = min(b.size, int64(countBits(b.have))*groupSize)
		}
		out = append(out, inf)
	}
	slices.SortFunc(out, func(a, b BlobInfo) int { return strings.Compare(a.CID.String(), b.CID.String()) })
	return out
}

// Used returns the bytes the store's blobs take (downloads at full size)
// and its budget.
func (s *Store) Used() (used, budget int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, s.opt.Budget
}

// makeRoomLocked evicts least recently used whole blobs that are not in
// use (and not keep) until size more bytes fit the budget, and returns the
// evicted blobs, whose files the caller removes without s.mu.
func (s *Store) makeRoomLocked(size int64, keep cas.Digest) ([]*blob, error) {
	if size > s.opt.Budget {
		return nil, fmt.Errorf("%w: %d bytes, budget %d", ErrFull, size, s.opt.Budget)
	}
	var victims []*blob
	for s.used+size > s.opt.Budget {
		var v *blob
		for d, b := range s.blobs {
			if d == keep || !b.complete || b.refs > 0 {
				continue
			}
			if v == nil || b.last < v.last {
				v = b
			}
		}
		if v == nil {
			for _, b := range victims { // nothing is evicted for a blob that does not fit
				s.blobs[b.cid.Digest()] = b
				b.gone = false
				s.used += b.size
			}
			return nil, fmt.Errorf("%w: %d bytes more, %d of %d used by downloads and blobs in use", ErrFull, size, s.used, s.opt.Budget)
		}
		delete(s.blobs, v.cid.Digest())
		v.gone = true
		s.used -= v.size
		victims = append(victims, v)
	}
	return victims, nil
}

func (s *Store) removeFiles(ctx context.Context, b *blob) {
	s.files.Remove(ctx, b.cid.Hex()+".m") // first: the rest is then claimed by nothing
	s.files.Remove(ctx, b.cid.Hex()+".o")
	for i := range pieces(b.size) {
		s.files.Remove(ctx, pieceName(b.cid, i))
	}
}

// Delete removes blob c (whole or in progress, not while a download of it
// is open).
func (s *Store) Delete(ctx context.Context, c cas.CID) error {
	s.mu.Lock()
	b := s.blobs[c.Digest()]
	if b == nil {
		s.mu.Unlock()
		return notFound(c)
	}
	if b.refs > 0 {
		s.mu.Unlock()
		return fmt.Errorf("browser store: %s is being downloaded", c)
	}
	delete(s.blobs, c.Digest())
	b.gone = true
	s.used -= b.size
	s.mu.Unlock()
	s.removeFiles(ctx, b)
	return nil
}

// Put stores data as a whole blob and returns its raw CID.
func (s *Store) Put(ctx context.Context, data []byte) (cas.CID, error) {
	var enc bao.Encoder
	enc.Write(data)
	root, ob := enc.Sum(nil)
	c := cas.RawCID(cas.Digest(root))
	size := int64(len(data))
	s.mu.Lock()
	if b := s.blobs[c.Digest()]; b != nil && b.complete {
		s.tick++
		b.last = s.tick
		s.mu.Unlock()
		return c, nil
	}
	if s.blobs[c.Digest()] != nil {
		s.mu.Unlock()
		return c, fmt.Errorf("browser store: %s is being downloaded", c)
	}
	victims, err := s.makeRoomLocked(size, c.Digest())
	if err != nil {
		s.mu.Unlock()
		return c, err
	}
	b := &blob{cid: c, size: size, refs: 1, ob: ob}
	s.blobs[c.Digest()] = b
	s.used += size
	s.mu.Unlock()
	for _, v := range victims {
		s.removeFiles(ctx, v)
	}
	err = func() error {
		for i := range pieces(size) {
			if err := s.files.Write(ctx, pieceName(c, i), data[i*pieceSize:min(size, (i+1)*pieceSize)]); err != nil {
				return err
			}
		}
		if err := s.files.Write(ctx, c.Hex()+".o", ob); err != nil {
			return err
		}
		return s.files.Write(ctx, c.Hex()+".m", encodeRecord(size, true, nil))
	}()
	s.mu.Lock()
	b.refs = 0
	if err != nil {
		delete(s.blobs, c.Digest())
		s.used -= size
		s.mu.Unlock()
		s.removeFiles(ctx, b)
		return c, fmt.Errorf("browser store: put %s: %w", c, err)
	}
	b.complete = true
	s.tick++
	b.last = s.tick
	s.mu.Unlock()
	return c, nil
}

// readCover reads the bytes [start, end) of b from its pieces, unverified.
func (s *Store) readCover(ctx context.Context, b *blob, start, end int64) ([]byte, error) {
	out := make([]byte, 0, end-start)
	for off := start; off < end; {
		i := off / pieceSize
		to := min(end, (i+1)*pieceSize)
		p, err := s.files.Read(ctx, pieceName(b.cid, i), off-i*pieceSize, to-off)
		if err != nil {
			return nil, &cas.RangeError{CID: b.cid, Off: off, Len: to - off, Reason: "piece unreadable: " + err.Error()}
		}
		if int64(len(p)) != to-off {
			return nil, &cas.RangeError{CID: b.cid, Off: off, Len: to - off, Reason: "piece is short"}
		}
		out = append(out, p...)
		off = to
	}
	return out, nil
}

// AppendSlice appends to dst the bao slice of [off, off+n) of whole blob
// c, read from storage and verified against c first; storage that changed
// is a *cas.RangeError (and the blob is dropped), never served. Safe for
// concurrent use; dst is not kept.
func (s *Store) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	return s.appendSlice(dst, c, off, n, false)
}

// PartialVerified returns the size and a copy of the bitmap of verified
// groups of c's download in progress; false if c is not being downloaded.
func (s *Store) PartialVerified(c cas.CID) (size int64, groups []uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blobs[c.Digest()]
	if b == nil || b.complete {
		return 0, nil, false
	}
	return b.size, slices.Clone(b.have), true
}

// AppendPartialSlice is AppendSlice for a blob held whole or in part:
// every group covering [off, off+n) must be verified already (else an
// error wrapping cas.ErrNotFound).
func (s *Store) AppendPartialSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	return s.appendSlice(dst, c, off, n, true)
}

func (s *Store) appendSlice(dst []byte, c cas.CID, off, n int64, part bool) ([]byte, error) {
	ctx := context.Background()
	s.mu.Lock()
	b := s.blobs[c.Digest()]
	if b == nil || !b.complete && !part {
		s.mu.Unlock()
		return dst, notFound(c)
	}
	if off < 0 || n <= 0 || off >= b.size || n > b.size-off || n > maxSlice {
		s.mu.Unlock()
		return dst, fmt.Errorf("blob %s: slice [%d, +%d) invalid for a blob of %d bytes (at most %d bytes a slice)", c, off, n, b.size, maxSlice)
	}
	start, end := bao.Cover(b.size, off, n)
	if !b.complete {
		for g := start / groupSize; g*groupSize < end; g++ {
			if b.have[g/64]&(1<<(g%64)) == 0 {
				s.mu.Unlock()
				return dst, fmt.Errorf("%w: %s: group %d is not verified yet", cas.ErrNotFound, c, g)
			}
		}
	}
	s.tick++
	b.last = s.tick
	s.mu.Unlock()
	cover, err := s.readCover(ctx, b, start, end)
	if err == nil {
		var scratch [bao.GroupSize]byte
		s.mu.Lock() // a download's outboard grows under s.mu
		err = rangeError(c, bao.VerifyCover(c.Digest(), b.ob, cover, b.size, off, n, &scratch))
		if err == nil {
			dst, err = bao.AppendSlice(dst, b.ob, cover, b.size, off, n)
		}
		s.mu.Unlock()
		if err == nil {
			return dst, nil
		}
	}
	if errors.Is(err, cas.ErrCorrupt) {
		s.dropCorrupt(ctx, b)
	}
	return dst, err
}

// dropCorrupt forgets a blob whose storage failed verification (changed
// outside the Store): a whole blob is removed; a download forgets every
// group, to be fetched again.
func (s *Store) dropCorrupt(ctx context.Context, b *blob) {
	s.mu.Lock()
	if s.blobs[b.cid.Digest()] != b {
		s.mu.Unlock()
		return
	}
	if b.complete && b.refs == 0 {
		delete(s.blobs, b.cid.Digest())
		b.gone = true
		s.used -= b.size
		s.mu.Unlock()
		s.removeFiles(ctx, b)
		return
	}
	if !b.complete {
		clear(b.have)
		b.missing = bao.Groups(b.size)
	}
	s.mu.Unlock()
	s.flush(ctx, b)
}

// Read returns bytes [off, off+n) of whole blob c, verified.
func (s *Store) Read(ctx context.Context, c cas.CID, off, n int64) ([]byte, error) {
	out := make([]byte, 0, max(0, min(n, 64<<20)))
	for n > 0 {
		k := min(n, maxSlice)
		s.mu.Lock()
		b := s.blobs[c.Digest()]
		s.mu.Unlock()
		if b == nil || !b.complete {
			return nil, notFound(c)
		}
		// Verified as a slice is, so a read is checked like a peer's.
		sl, err := s.AppendSlice(nil, c, off, k)
		if err != nil {
			return nil, err
		}
		start, end := bao.Cover(b.size, off, k)
		cover := make([]byte, end-start)
		var scratch [bao.GroupSize]byte
		if err := bao.DecodeSlice(cover, sl, c.Digest(), b.size, off, k, &scratch); err != nil {
			return nil, rangeError(c, err)
		}
		out = append(out, cover[off-start:off-start+k]...)
		off, n = off+k, n-k
	}
	return out, nil
}

// Collection reads and parses the stored collection c names (a collection
// CID; a raw one is refused with cas.ErrNotCollection).
func (s *Store) Collection(c cas.CID) (*cas.Collection, error) {
	if !c.IsCollection() {
		return nil, fmt.Errorf("%s: %w: a raw CID reads as its bytes", c, cas.ErrNotCollection)
	}
	inf, err := s.Stat(c)
	if err != nil {
		return nil, err
	}
	if inf.Size > cas.MaxCollectionSize {
		return nil, fmt.Errorf("%s: %w: %d bytes", c, cas.ErrNotCollection, inf.Size)
	}
	b, err := s.Read(context.Background(), c, 0, inf.Size)
	if err != nil {
		return nil, err
	}
	return cas.ParseCollection(b)
}

// Hash returns the BLAKE3 hash of the bytes kept for whole blob c, as
// read back from storage and hashed by zeebo/blake3, a BLAKE3 other than
// the one that verified them (cas/bao's): what a test compares with c.
func (s *Store) Hash(ctx context.Context, c cas.CID) ([32]byte, error) {
	s.mu.Lock()
	b := s.blobs[c.Digest()]
	s.mu.Unlock()
	if b == nil || !b.complete {
		return [32]byte{}, notFound(c)
	}
	h := blake3.New()
	for i := range pieces(b.size) {
		want := min(pieceSize, b.size-i*pieceSize)
		p, err := s.files.Read(ctx, pieceName(c, i), 0, want)
		if err != nil {
			return [32]byte{}, err
		}
		if int64(len(p)) != want {
			return [32]byte{}, fmt.Errorf("piece %d of %s is %d bytes; want %d", i, c, len(p), want)
		}
		h.Write(p)
	}
	var out [32]byte
	h.Sum(out[:0])
	return out, nil
}

// OpenPartial opens (or resumes) the download of c, a blob of size bytes,
// reserving its size in the budget. Several opens share one download;
// each is matched by Close or Finish.
func (s *Store) OpenPartial(c cas.CID, size int64) (swarm.Partial, error) {
	if size < 0 || size > maxRecordGroups*groupSize {
		return nil, fmt.Errorf("browser store: %s: size %d out of range", c, size)
	}
	s.mu.Lock()
	if b := s.blobs[c.Digest()]; b != nil {
		defer s.mu.Unlock()
		if b.size != size {
			return nil, fmt.Errorf("browser store: %s: size %d; %d is held", c, size, b.size)
		}
		if !b.complete {
			b.refs++
		}
		return &partial{s: s, b: b, c: c, done: b.complete}, nil
	}
	victims, err := s.makeRoomLocked(size, c.Digest())
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	groups := bao.Groups(size)
	b := &blob{cid: c.Raw(), size: size, have: make([]uint64, (groups+63)/64), missing: groups,
		ob: make([]byte, bao.OutboardSize(size)), refs: 1, flushed: s.opt.Now()}
	binary.LittleEndian.PutUint64(b.ob, uint64(size))
	s.blobs[c.Digest()] = b
	s.used += size
	s.mu.Unlock()
	ctx := context.Background()
	for _, v := range victims {
		s.removeFiles(ctx, v)
	}
	if err := s.files.Write(ctx, c.Hex()+".m", encodeRecord(size, false, b.have)); err != nil {
		s.mu.Lock()
		delete(s.blobs, c.Digest())
		s.used -= size
		s.mu.Unlock()
		return nil, fmt.Errorf("browser store: %s: %w", c, err)
	}
	return &partial{s: s, b: b, c: c}, nil
}

// flush makes b's progress durable: outboard, then the record that
// claims it.
func (s *Store) flush(ctx context.Context, b *blob) error {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	s.mu.Lock()
	if b.gone {
		s.mu.Unlock()
		return nil
	}
	ob := slices.Clone(b.ob)
	rec := encodeRecord(b.size, b.complete, b.have)
	b.unsynced, b.flushed = 0, s.opt.Now()
	s.mu.Unlock()
	if err := s.files.Write(ctx, b.cid.Hex()+".o", ob); err != nil {
		return err
	}
	return s.files.Write(ctx, b.cid.Hex()+".m", rec)
}

// partial is one open of a download.
type partial struct {
	s      *Store
	b      *blob
	c      cas.CID // as opened
	done   bool    // the blob was whole at open
	closed bool    // guarded by s.mu
}

func (p *partial) WriteSlice(off, n int64, slice []byte) error {
	s, b := p.s, p.b
	s.mu.Lock()
	if p.done || b.complete {
		s.mu.Unlock()
		return nil
	}
	if p.closed || b.gone {
		s.mu.Unlock()
		return cas.ErrClosed
	}
	if b.size == 0 {
		defer s.mu.Unlock()
		if b.cid.Digest() != cas.Sum(nil).Digest() {
			return &cas.RangeError{CID: b.cid, Reason: "empty blob does not hash to its CID"}
		}
		b.have[0] |= 1
		b.missing = 0
		return nil
	}
	s.mu.Unlock()
	if off < 0 || n <= 0 || off >= b.size || n > b.size-off || n > maxSlice {
		return fmt.Errorf("browser store: %s: slice [%d, +%d) invalid for %d bytes", b.cid, off, n, b.size)
	}
	start, end := bao.Cover(b.size, off, n)
	cover := make([]byte, end-start)
	var scratch [bao.GroupSize]byte
	if err := bao.DecodeSlice(cover, slice, b.cid.Digest(), b.size, off, n, &scratch); err != nil {
		return rangeError(b.cid, err)
	}
	ctx := context.Background()
	if err := p.writePieces(ctx, start, end, cover); err != nil {
		return fmt.Errorf("browser store: %s: write: %w", b.cid, err)
	}
	s.mu.Lock()
	if b.gone {
		s.mu.Unlock()
		return cas.ErrClosed
	}
	bao.CopySliceNodes(b.ob, slice, b.size, off, n)
	for g := start / groupSize; g*groupSize < end; g++ {
		if b.have[g/64]&(1<<(g%64)) == 0 {
			b.have[g/64] |= 1 << (g % 64)
			b.missing--
		}
	}
	b.unsynced += end - start
	due := b.unsynced >= s.opt.FlushBytes || s.opt.Now().Sub(b.flushed) >= 2*time.Second
	s.mu.Unlock()
	if due {
		return s.flush(ctx, b)
	}
	return nil
}

// writePieces writes cover, the verified bytes [start, end), into the
// piece files. A piece written in part is merged with what its file holds
// (its verified groups, and zeros where none is: the record says which).
func (p *partial) writePieces(ctx context.Context, start, end int64, cover []byte) error {
	b := p.b
	b.wmu.Lock()
	defer b.wmu.Unlock()
	for off := start; off < end; {
		i := off / pieceSize
		ps, pe := i*pieceSize, min(b.size, (i+1)*pieceSize)
		to := min(end, pe)
		seg := cover[off-start : to-start]
		if off == ps && to == pe {
			if err := p.s.files.Write(ctx, pieceName(b.cid, i), seg); err != nil {
				return err
			}
			off = to
			continue
		}
		old, err := p.s.files.Read(ctx, pieceName(b.cid, i), 0, pe-ps)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		buf := make([]byte, pe-ps)
		copy(buf, old)
		copy(buf[off-ps:], seg)
		if err := p.s.files.Write(ctx, pieceName(b.cid, i), buf); err != nil {
			return err
		}
		off = to
	}
	return nil
}

func (p *partial) Missing() []cas.Range {
	s, b := p.s, p.b
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.done || b.complete {
		return nil
	}
	var out []cas.Range
	for g := range bao.Groups(b.size) {
		if b.have[g/64]&(1<<(g%64)) != 0 {
			continue
		}
		off := g * groupSize
		end := min(off+groupSize, b.size)
		if k := len(out) - 1; k >= 0 && out[k].Off+out[k].Len == off {
			out[k].Len += end - off
		} else {
			out = append(out, cas.Range{Off: off, Len: end - off})
		}
	}
	if b.size == 0 && b.have[0]&1 == 0 {
		out = []cas.Range{{Off: 0, Len: 0}}
	}
	return out
}

func (p *partial) Finish(ctx context.Context) (cas.Info, error) {
	s, b := p.s, p.b
	s.mu.Lock()
	inf := cas.Info{CID: p.c, Size: b.size, Collection: p.c.IsCollection()}
	if p.done || b.complete {
		p.closed = true
		s.mu.Unlock()
		return inf, nil
	}
	if p.closed || b.gone {
		s.mu.Unlock()
		return cas.Info{}, cas.ErrClosed
	}
	if b.missing > 0 {
		s.mu.Unlock()
		return cas.Info{}, fmt.Errorf("browser store: %s: %d of %d groups still missing", b.cid, b.missing, bao.Groups(b.size))
	}
	if err := bao.VerifyTree(b.cid.Digest(), b.ob, b.size); err != nil {
		s.mu.Unlock()
		return cas.Info{}, rangeError(b.cid, err)
	}
	b.complete, b.have, b.refs = true, nil, 0
	p.closed = true
	s.tick++
	b.last = s.tick
	s.mu.Unlock()
	if b.size == 0 {
		if err := s.files.Write(ctx, pieceName(b.cid, 0), nil); err != nil {
			return cas.Info{}, err
		}
	}
	if err := s.flush(ctx, b); err != nil {
		return cas.Info{}, fmt.Errorf("browser store: finish %s: %w", b.cid, err)
	}
	return inf, nil
}

func (p *partial) Close() error {
	s, b := p.s, p.b
	s.mu.Lock()
	if p.closed {
		s.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.done || b.complete {
		s.mu.Unlock()
		return nil
	}
	b.refs--
	s.mu.Unlock()
	return s.flush(context.Background(), b)
}
