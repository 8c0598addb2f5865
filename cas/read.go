//go:build !js

package cas

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/rdrr/peer/cas/bao"
	bolt "go.etcd.io/bbolt"
)

// maxRead bounds the bytes one verified read holds in memory.
const maxRead = 4 << 20

type readBuf struct {
	cover   []byte
	scratch [bao.GroupSize]byte
	iov     [][]byte // a slice's groups being written (Partial.WriteSlice)
}

// readBufs holds the buffers of verified reads and slice writes. A buffer
// grows to the largest cover it has held (at most maxRead plus two groups),
// so a 256 KiB read never pays for a 4 MiB one.
var readBufs = sync.Pool{New: func() any { return new(readBuf) }}

// setCover sizes rb.cover to n bytes, growing it if needed.
func (rb *readBuf) setCover(n int64) {
	if int64(cap(rb.cover)) < n {
		rb.cover = make([]byte, n)
	}
	rb.cover = rb.cover[:n]
}

// servable returns c's record if c is stored and not known to be corrupt.
func (s *Store) servable(c CID) (record, error) {
	if err := s.checkOpen(); err != nil {
		return record{}, err
	}
	var r record
	err := s.db.View(func(tx *bolt.Tx) error {
		var ok bool
		var err error
		r, ok, err = getView(tx, c)
		if err == nil && !ok {
			err = notFound(c)
		}
		return err
	})
	if err == nil && r.Flags&flagCorrupt != 0 {
		err = &RangeError{CID: c, Off: 0, Len: r.Size, Reason: "blob was found corrupt (run `peer scrub`)"}
	}
	return r, err
}

// outboard returns c's outboard, from the cache or the disk. It is proved
// against the root on each use, never trusted on its own.
func (s *Store) outboard(c CID, size int64) ([]byte, error) {
	if ob, ok := s.obCache.Get(c.Digest()); ok {
		return ob, nil
	}
	ob, err := os.ReadFile(s.outboardPath(c))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &RangeError{CID: c, Off: 0, Len: size, Reason: "outboard file missing"}
		}
		return nil, fmt.Errorf("blob %s: %w", c, err)
	}
	if int64(len(ob)) != bao.OutboardSize(size) {
		return nil, &RangeError{CID: c, Off: 0, Len: size, Reason: fmt.Sprintf("outboard is %d bytes; want %d", len(ob), bao.OutboardSize(size))}
	}
	s.obCache.Add(c.Digest(), ob)
	return ob, nil
}

// readCover reads and verifies the groups covering [off, off+n) of c into
// rb.cover, returning the cover's start offset and the outboard that
// proved it.
func (s *Store) readCover(f *os.File, c CID, size, off, n int64, rb *readBuf) (int64, []byte, error) {
	ob, err := s.outboard(c, size)
	if err != nil {
		return 0, nil, err
	}
	start, end := bao.Cover(size, off, n)
	if n == 0 {
		start, end = 0, min(size, GroupSize)
	}
	rb.setCover(end - start)
	if m, err := f.ReadAt(rb.cover, start); m != len(rb.cover) {
		if err == io.EOF || err == nil {
			return 0, nil, &RangeError{CID: c, Off: start + int64(m), Len: end - start - int64(m), Reason: "blob file is truncated"}
		}
		return 0, nil, fmt.Errorf("blob %s: %w", c, err)
	}
	if err := bao.VerifyCover(c.Digest(), ob, rb.cover, size, off, n, &rb.scratch); err != nil {
		s.obCache.Remove(c.Digest()) // maybe the outboard is what went bad; reread next time
		return 0, nil, s.rangeError(c, err)
	}
	return start, ob, nil
}

// rangeError turns a bao verification error into a RangeError for c.
func (s *Store) rangeError(c CID, err error) error {
	var be *bao.Error
	if errors.As(err, &be) {
		s.log.Warn("corrupt data", "cid", c, "off", be.Off, "len", be.Len, "reason", be.Reason)
		return &RangeError{CID: c, Off: be.Off, Len: be.Len, Reason: be.Reason}
	}
	return err
}

func (s *Store) openBlob(c CID, size int64) (*os.File, error) {
	f, err := os.Open(s.blobPath(c))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, &RangeError{CID: c, Off: 0, Len: size, Reason: "blob file missing"}
		}
		return nil, fmt.Errorf("blob %s: %w", c, err)
	}
	return f, nil
}

// AppendSlice appends to dst the bao slice encoding of [off, off+n) of c:
// the data of the covering groups with the tree nodes that prove them (see
// package bao). The data is verified as it is read, so a corrupt blob is
// never served: the error is a *RangeError. Safe for concurrent use.
func (s *Store) AppendSlice(dst []byte, c CID, off, n int64) ([]byte, error) {
	size, f, err := s.openSlice(c, off, n)
	if err != nil {
		return dst, err
	}
	defer f.Close()
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	_, ob, err := s.readCover(f, c, size, off, n, rb)
	if err != nil {
		return dst, err
	}
	s.touch(c)
	return bao.AppendSlice(dst, ob, rb.cover, size, off, n)
}

// openSlice opens stored blob c for a slice [off, off+n) of it, which it
// checks (within the blob, at most maxRead): the blob's size and its open
// file, for the caller to close.
func (s *Store) openSlice(c CID, off, n int64) (int64, *os.File, error) {
	r, err := s.servable(c)
	if err != nil {
		return 0, nil, err
	}
	if off < 0 || n <= 0 || off+n > r.Size || n > maxRead {
		return 0, nil, fmt.Errorf("blob %s: slice [%d, %d) invalid for a blob of %d bytes (at most %d bytes per slice)", c, off, off+n, r.Size, maxRead)
	}
	f, err := s.openBlob(c, r.Size)
	if err != nil {
		return 0, nil, err
	}
	return r.Size, f, nil
}

// AppendSliceUnchecked is AppendSlice without hashing the bytes again:
// the tree nodes and the data are appended as stored (the data read
// straight into dst), for a server whose receiver verifies every group
// against the CID before it uses any (package swarm; PROTOCOL.md section
// 4). They were verified when they were stored, so a second hash here
// protects only against this disk changing them since; such a change
// reaches the receiver, which refuses it, and CheckRange (or Scrub) then
// finds it here and marks the blob corrupt. A blob marked corrupt is
// refused, as by AppendSlice. Safe for concurrent use.
func (s *Store) AppendSliceUnchecked(dst []byte, c CID, off, n int64) ([]byte, error) {
	size, f, err := s.openSlice(c, off, n)
	if err != nil {
		return dst, err
	}
	defer f.Close()
	ob, err := s.outboard(c, size)
	if err != nil {
		return dst, err
	}
	s.touch(c)
	return bao.AppendSliceAt(dst, ob, size, off, n, func(p []byte, at int64) error {
		return readFull(f, p, at, c, "blob file")
	})
}

// readFull reads len(p) bytes of c's file f at off; a short file is a
// *RangeError.
func readFull(f *os.File, p []byte, off int64, c CID, what string) error {
	m, err := f.ReadAt(p, off)
	if m == len(p) {
		return nil
	}
	if err == io.EOF || err == nil {
		return &RangeError{CID: c, Off: off + int64(m), Len: int64(len(p) - m), Reason: what + " is truncated"}
	}
	return fmt.Errorf("blob %s: %w", c, err)
}

// CheckRange reads [off, off+n) of c back and verifies it, as Scrub does
// for a whole blob: for a server told by a peer that bytes it served
// (AppendSliceUnchecked, AppendPartialSliceUnchecked) failed
// verification. A stored blob that fails is marked corrupt (not served
// again until a scrub finds it good or a new copy replaces it); groups of
// a download in progress that fail are marked missing again, so that the
// download fetches them anew (they are no longer served either). The
// error then wraps a *RangeError for each bad range; it wraps ErrNotFound
// if c is neither stored nor being downloaded. Safe for concurrent use.
func (s *Store) CheckRange(c CID, off, n int64) error {
	if p := s.openPartial(c); p != nil {
		if err, ok := p.checkRange(off, n); ok {
			return err
		}
	}
	rd, err := s.Open(c)
	if err != nil {
		return err
	}
	defer rd.Close()
	if off < 0 || n <= 0 || off+n > rd.size {
		return fmt.Errorf("blob %s: range [%d, %d) invalid for a blob of %d bytes", c, off, off+n, rd.size)
	}
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	for a := off; a < off+n; {
		k := min(off+n-a, maxRead)
		if _, _, err := s.readCover(rd.f, c, rd.size, a, k, rb); err != nil {
			var re *RangeError
			if errors.As(err, &re) {
				if merr := s.markCorrupt(c); merr != nil {
					return errors.Join(err, merr)
				}
			}
			return err
		}
		a += k
	}
	return nil
}

// ReadAt reads len(p) bytes of c at off into p, verifying them first. It
// returns io.EOF when fewer bytes remain, like io.ReaderAt. Safe for
// concurrent use.
func (s *Store) ReadAt(c CID, p []byte, off int64) (int, error) {
	rd, err := s.Open(c)
	if err != nil {
		return 0, err
	}
	defer rd.Close()
	return rd.ReadAt(p, off)
}

// Reader reads one blob, verifying every group before returning its bytes.
// It implements io.Reader, io.ReaderAt, io.Seeker and io.WriterTo. ReadAt is
// safe for concurrent use; Read and Seek are not.
type Reader struct {
	s    *Store
	c    CID
	size int64
	f    *os.File
	pos  int64
}

// Open opens c for verified reading.
func (s *Store) Open(c CID) (*Reader, error) {
	r, err := s.servable(c)
	if err != nil {
		return nil, err
	}
	f, err := s.openBlob(c, r.Size)
	if err != nil {
		return nil, err
	}
	s.touch(c)
	return &Reader{s: s, c: c, size: r.Size, f: f}, nil
}

// Size returns the blob's size.
func (r *Reader) Size() int64 { return r.size }

// Close closes the blob file.
func (r *Reader) Close() error { return r.f.Close() }

// WillNeed tells the store that [off, off+n) will be read soon: the file's
// pages start coming from disk at once, in large requests. For a reader
// that then reads the range in parts from several goroutines (a cold
// 64 MiB key read by 16 of them reached 0.75x of one sequential read
// without it on the H100's host). Only a hint.
func (r *Reader) WillNeed(off, n int64) {
	if off < 0 || n <= 0 || off >= r.size {
		return
	}
	willNeed(r.f, off, min(n, r.size-off))
}

// ReadAt implements io.ReaderAt with verification.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("blob %s: negative offset", r.c)
	}
	if off >= r.size {
		if len(p) == 0 && off == r.size {
			return 0, nil
		}
		return 0, io.EOF
	}
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	total := 0
	for len(p) > 0 && off < r.size {
		n := min(int64(len(p)), r.size-off, maxRead)
		start, _, err := r.s.readCover(r.f, r.c, r.size, off, n, rb)
		if err != nil {
			return total, err
		}
		copy(p[:n], rb.cover[off-start:])
		p = p[n:]
		off += n
		total += int(n)
	}
	if len(p) > 0 {
		return total, io.EOF
	}
	return total, nil
}

// Read implements io.Reader.
func (r *Reader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.size-r.pos)]
	n, err := r.ReadAt(p, r.pos)
	r.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Seek implements io.Seeker.
func (r *Reader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	default:
		return 0, fmt.Errorf("seek: bad whence %d", whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("seek: negative position")
	}
	r.pos = offset
	return offset, nil
}

// WriteTo implements io.WriterTo: it streams the rest of the blob to w in
// verified windows.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	rb := readBufs.Get().(*readBuf)
	defer readBufs.Put(rb)
	var total int64
	for r.pos < r.size {
		n := min(r.size-r.pos, maxRead)
		start, _, err := r.s.readCover(r.f, r.c, r.size, r.pos, n, rb)
		if err != nil {
			return total, err
		}
		m, err := w.Write(rb.cover[r.pos-start : r.pos-start+n])
		total += int64(m)
		r.pos += int64(m)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
