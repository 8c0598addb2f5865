//go:build !js

package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"

	"golang.org/x/sync/errgroup"
)

// Collection reads and parses the collection c names. A raw CID is
// refused with ErrNotCollection, whatever its bytes: only a collection
// CID says to read a blob as a collection.
func (s *Store) Collection(c CID) (*Collection, error) {
	if !c.IsCollection() {
		return nil, fmt.Errorf("%s: %w: a raw CID reads as its bytes", c, ErrNotCollection)
	}
	if _, err := s.statCollection(c); err != nil {
		return nil, err
	}
	rd, err := s.Open(c)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	col, err := readCollection(rd, rd.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c, err)
	}
	return col, nil
}

// statCollection is Stat, except that a collection CID whose bytes are
// stored as raw only (a rebuilt index forgets collections) is held as a
// collection first, if its bytes are one.
func (s *Store) statCollection(c CID) (Info, error) {
	inf, err := s.Stat(c)
	if c.IsCollection() && errors.Is(err, ErrNotFound) && s.Has(c.Raw()) {
		return s.holdAsCollection(c)
	}
	return inf, err
}

// PutCollection stores col's blob under its collection CID, linked to its
// shards in the same index transaction, so GC keeps the shards while it is
// stored. col must be valid (ParseCollection accepts its bytes).
func (s *Store) PutCollection(ctx context.Context, col *Collection) (Info, error) {
	b := col.Marshal()
	if _, err := ParseCollection(b); err != nil {
		return Info{}, err
	}
	return s.put(ctx, bytes.NewReader(b), col)
}

func (col *Collection) children() []CID {
	out := make([]CID, len(col.Shards))
	for i, sh := range col.Shards {
		out[i] = sh.CID
	}
	return out
}

// AddProgress reports bytes stored so far out of total. Calls do not
// overlap.
type AddProgress func(done, total int64)

// AddFile stores the file at path: as one raw blob if it is at most
// ShardSize, else as ShardSize shards plus a collection blob whose
// collection CID names the file.
func (s *Store) AddFile(ctx context.Context, path string, progress AddProgress) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("add %s: not a regular file", path)
	}
	size := fi.Size()
	if size <= ShardSize {
		inf, err := s.Put(ctx, f)
		if err == nil && progress != nil {
			progress(size, size)
		}
		return inf, err
	}
	// Shard k+1 is read, hashed and written while shard k is synced and
	// indexed: on a disk whose fsync of 64 MiB takes as long as the write,
	// that overlap is most of add's speed.
	col := &Collection{Size: size}
	var mu sync.Mutex // progress is called from the commit goroutines
	var committed int64
	var g errgroup.Group
	g.SetLimit(2)
	for off := int64(0); off < size; off += ShardSize {
		n := min(ShardSize, size-off)
		st, err := s.stage(ctx, io.NewSectionReader(f, off, n))
		if err != nil {
			g.Wait()
			return Info{}, fmt.Errorf("add %s: shard at %d: %w", path, off, err)
		}
		if st.size != n {
			st.discard()
			g.Wait()
			return Info{}, fmt.Errorf("add %s: file changed while being added", path)
		}
		col.Shards = append(col.Shards, Shard{CID: st.cid, Size: n})
		g.Go(func() error {
			if _, err := st.commit(nil); err != nil {
				return fmt.Errorf("add %s: shard at %d: %w", path, off, err)
			}
			if progress != nil {
				mu.Lock()
				committed += n
				progress(committed, size)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Info{}, err
	}
	return s.PutCollection(ctx, col)
}

// FileReader reads a blob or, for a collection, the file its shards make,
// verifying every byte. ReadAt is safe for concurrent use.
type FileReader struct {
	s      *Store
	size   int64
	shards []Shard
	starts []int64
	pos    int64
}

// OpenFile opens c as a file: a raw CID reads as its bytes, a collection
// CID as the concatenation of its shards.
func (s *Store) OpenFile(c CID) (*FileReader, error) {
	inf, err := s.statCollection(c)
	if err != nil {
		return nil, err
	}
	fr := &FileReader{s: s, size: inf.Size, shards: []Shard{{CID: c, Size: inf.Size}}}
	if c.IsCollection() {
		col, err := s.Collection(c)
		if err != nil {
			return nil, err
		}
		fr.size, fr.shards = col.Size, col.Shards
	}
	var off int64
	for _, sh := range fr.shards {
		fr.starts = append(fr.starts, off)
		off += sh.Size
	}
	return fr, nil
}

// Size returns the file's size.
func (fr *FileReader) Size() int64 { return fr.size }

// Shards returns the blobs the file is made of.
func (fr *FileReader) Shards() []Shard { return fr.shards }

// ReadAt implements io.ReaderAt across shards.
func (fr *FileReader) ReadAt(p []byte, off int64) (int, error) {
	total := 0
	for len(p) > 0 && off < fr.size {
		i := sort.Search(len(fr.starts), func(i int) bool { return fr.starts[i] > off }) - 1
		sh := fr.shards[i]
		rel := off - fr.starts[i]
		n := min(int64(len(p)), sh.Size-rel)
		m, err := fr.s.ReadAt(sh.CID, p[:n], rel)
		total += m
		if err != nil && !(err == io.EOF && int64(m) == n) {
			return total, err
		}
		p, off = p[n:], off+n
	}
	if len(p) > 0 {
		return total, io.EOF
	}
	return total, nil
}

// Read implements io.Reader.
func (fr *FileReader) Read(p []byte) (int, error) {
	if fr.pos >= fr.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), fr.size-fr.pos)]
	n, err := fr.ReadAt(p, fr.pos)
	fr.pos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Seek implements io.Seeker.
func (fr *FileReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		offset += fr.pos
	case io.SeekEnd:
		offset += fr.size
	}
	if offset < 0 {
		return 0, fmt.Errorf("seek: negative position")
	}
	fr.pos = offset
	return offset, nil
}

// WriteTo streams the rest of the file to w, one verified shard at a time.
func (fr *FileReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for i, sh := range fr.shards {
		end := fr.starts[i] + sh.Size
		if fr.pos >= end {
			continue
		}
		rd, err := fr.s.Open(sh.CID)
		if err != nil {
			return total, err
		}
		rd.Seek(fr.pos-fr.starts[i], io.SeekStart)
		n, err := rd.WriteTo(w)
		rd.Close()
		total += n
		fr.pos += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
