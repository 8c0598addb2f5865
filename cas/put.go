//go:build !js

package cas

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/rdrr/peer/cas/bao"
	bolt "go.etcd.io/bbolt"
)

const (
	putBufSize  = 1 << 20 // bytes per pipeline buffer (a multiple of GroupSize)
	putBuffers  = 4       // buffers in flight between the hasher and the writer
	writeBehind = 8 << 20 // start writeback every this many bytes
)

// Put stores the bytes of r as one blob and returns its Info. The bytes are
// read once: hashed (root and outboard) on this goroutine while another
// writes them to a temporary file, which is then synced and renamed into
// place before the index commit. If the blob is already stored, Put returns
// its Info and keeps the existing copy. ctx cancels a Put in progress.
//
// The CID is always raw: the bytes read back as themselves, even if they
// happen to be a collection (PutCollection stores one).
func (s *Store) Put(ctx context.Context, r io.Reader) (Info, error) {
	return s.put(ctx, r, nil)
}

// putFile is the io.Writer side of Put: a goroutine that writes buffers to
// the temporary file in order and starts their writeback early, so that
// the final fsync has little left to do.
type putFile struct {
	f       *os.File
	ch      chan []byte
	free    chan []byte
	done    chan error
	noSync  bool
	failed  atomic.Bool
	written int64
	synced  int64
}

func newPutFile(f *os.File, noSync bool) *putFile {
	w := &putFile{f: f, ch: make(chan []byte, putBuffers), free: make(chan []byte, putBuffers), done: make(chan error, 1), noSync: noSync}
	for range putBuffers {
		w.free <- make([]byte, putBufSize)
	}
	go w.run()
	return w
}

func (w *putFile) run() {
	var err error
	for b := range w.ch {
		if err == nil {
			_, err = w.f.Write(b)
			if err != nil {
				w.failed.Store(true)
			}
			w.written += int64(len(b))
			if err == nil && !w.noSync && w.written-w.synced >= writeBehind {
				// Ask the kernel to start writing back what we have; the
				// fsync at the end then waits for little.
				startWriteback(w.f, w.synced, w.written-w.synced)
				w.synced = w.written
			}
		}
		w.free <- b[:cap(b)]
	}
	w.done <- err
}

// put stores r; if col is not nil, r is col's blob, stored under its
// collection CID with its shards linked in the same transaction.
func (s *Store) put(ctx context.Context, r io.Reader, col *Collection) (Info, error) {
	st, err := s.stage(ctx, r)
	if err != nil {
		return Info{}, err
	}
	return st.commit(col)
}

// staged is a blob written to a temporary file and hashed, not yet durable
// or indexed.
type staged struct {
	s    *Store
	f    *os.File
	cid  CID
	size int64
	ob   []byte
}

// stage reads r once, hashing it on this goroutine while another writes it
// to a temporary file.
func (s *Store) stage(ctx context.Context, r io.Reader) (*staged, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Join(s.dir, dirTmp), "put-*")
	if err != nil {
		return nil, fmt.Errorf("put: %w", err)
	}
	var enc bao.Encoder
	w := newPutFile(f, s.opt.NoSync)
	var rerr error
	for rerr == nil {
		if err := ctx.Err(); err != nil {
			rerr = err
			break
		}
		b := <-w.free
		if w.failed.Load() { // the writer failed (disk full): stop reading
			w.free <- b
			rerr = io.EOF
			break
		}
		n, err := io.ReadFull(r, b)
		if n > 0 {
			enc.Write(b[:n])
			w.ch <- b[:n]
		} else {
			w.free <- b
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			rerr = io.EOF
		case err != nil:
			rerr = fmt.Errorf("put: read: %w", err)
		}
	}
	close(w.ch)
	werr := <-w.done
	st := &staged{s: s, f: f, size: enc.Size()}
	switch {
	case rerr != io.EOF:
		st.discard()
		return nil, rerr
	case werr != nil:
		st.discard()
		return nil, fmt.Errorf("put: %w", werr)
	}
	root, ob := enc.Sum(nil)
	st.cid, st.ob = RawCID(root), ob
	return st, nil
}

func (st *staged) discard() {
	st.f.Close()
	os.Remove(st.f.Name())
}

// commit makes the staged blob durable and indexes it: as a raw blob, or
// as the collection col if that is not nil.
func (st *staged) commit(col *Collection) (Info, error) {
	defer st.discard() // no-op once renamed
	c, links := st.cid, []CID(nil)
	if col != nil {
		c, links = CollectionCID(c.Digest()), col.children()
	}
	if err := st.s.syncFile(st.f); err != nil {
		return Info{}, fmt.Errorf("put: sync: %w", err)
	}
	if err := st.f.Close(); err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	return st.s.commitBlob(c, st.size, st.f.Name(), st.ob, links)
}

// commitBlob publishes a verified blob: it writes the outboard, renames the
// data file into place (unless dataTmp is already its place), syncs the
// directories, and only then indexes both in one transaction. dataTmp must
// already be synced. If the blob is
// already stored the new copy is dropped. For a collection CID, links are
// its shards, linked in the same transaction (and the blob, if already
// stored as raw, is held as a collection from then on).
func (s *Store) commitBlob(c CID, size int64, dataTmp string, ob []byte, links []CID) (Info, error) {
	s.commit.Lock()
	defer s.commit.Unlock()
	if inf, err := s.Stat(c.Raw()); err == nil && !inf.Corrupt {
		s.touch(c)
		if c.IsCollection() {
			return s.linkCollectionLocked(c, links)
		}
		return inf, nil
	}
	obTmp, err := s.writeTemp(ob)
	if err != nil {
		return Info{}, err
	}
	defer os.Remove(obTmp)
	bp, op := s.blobPath(c), s.outboardPath(c)
	for _, p := range []string{bp, op} {
		if err := s.mkdir(filepath.Dir(p)); err != nil {
			return Info{}, fmt.Errorf("put %s: %w", c, err)
		}
	}
	if err := s.fs.rename(obTmp, op); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", c, err)
	}
	if dataTmp != bp { // adopt publishes a file already in place
		if err := s.fs.rename(dataTmp, bp); err != nil {
			return Info{}, fmt.Errorf("put %s: %w", c, err)
		}
	}
	if err := errors.Join(s.syncDir(filepath.Dir(bp)), s.syncDir(filepath.Dir(op))); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", c, err)
	}
	now := s.opt.Now().UnixNano()
	rec := record{Size: size, Added: now, Accessed: now, Verified: now}
	if c.IsCollection() {
		rec.Flags |= flagCollection
	}
	var inf Info
	err = s.db.Update(func(tx *bolt.Tx) error {
		if old, ok, _ := getRecord(tx, c); ok && old.Flags&flagCollection != 0 {
			rec.Flags |= flagCollection // a corrupt copy replaced: its links stay
		}
		if err := putRecord(tx, c, &rec); err != nil {
			return err
		}
		if c.IsCollection() {
			if err := link(tx, c, links); err != nil {
				return err
			}
		}
		inf = s.info(tx, c, rec)
		tx.OnCommit(func() { s.fs.committed(c) })
		return nil
	})
	if err != nil {
		// The files are unindexed; the next Open adopts or removes them.
		return Info{}, fmt.Errorf("put %s: index: %w", c, err)
	}
	s.obCache.Add(c.Digest(), ob)
	return inf, nil
}

// linkCollectionLocked holds the stored blob c as a collection with the
// given shards, if it is not already. s.commit must be held.
func (s *Store) linkCollectionLocked(c CID, links []CID) (Info, error) {
	var inf Info
	err := s.db.Update(func(tx *bolt.Tx) error {
		r, ok, err := getRecord(tx, c)
		if err != nil || !ok {
			return errors.Join(err, notFound(c))
		}
		if r.Flags&flagCollection == 0 {
			r.Flags |= flagCollection
			if err := putRecord(tx, c, &r); err != nil {
				return err
			}
			if err := link(tx, c, links); err != nil {
				return err
			}
		}
		inf = s.info(tx, c, r)
		return nil
	})
	if err != nil {
		return Info{}, fmt.Errorf("collection %s: %w", c, err)
	}
	return inf, nil
}

// holdAsCollection makes the stored blob of c (a collection CID) readable
// as a collection: its bytes are read (verified) and parsed, and its shards
// linked. Bytes that are not a collection are refused.
func (s *Store) holdAsCollection(c CID) (Info, error) {
	if inf, err := s.Stat(c); err == nil {
		return inf, nil
	}
	rd, err := s.Open(c.Raw())
	if err != nil {
		return Info{}, err
	}
	defer rd.Close()
	col, err := readCollection(rd, rd.Size())
	if err != nil {
		return Info{}, fmt.Errorf("%s: %w", c, err)
	}
	s.commit.Lock()
	defer s.commit.Unlock()
	return s.linkCollectionLocked(c, col.children())
}

// mkdir creates dir if needed, durably: a new directory's entry in its
// parent is synced too.
func (s *Store) mkdir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return s.syncDir(filepath.Dir(dir))
}

// writeTemp writes b to a synced temporary file and returns its path.
func (s *Store) writeTemp(b []byte) (string, error) {
	f, err := os.CreateTemp(filepath.Join(s.dir, dirTmp), "ob-*")
	if err != nil {
		return "", err
	}
	_, err = f.Write(b)
	if err == nil {
		err = s.syncFile(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write %s: %w", f.Name(), err)
	}
	return f.Name(), nil
}

// readCollection reads and parses the collection blob of size bytes in r
// (verified bytes: a Reader, or a download whose groups were verified).
func readCollection(r io.ReaderAt, size int64) (*Collection, error) {
	if size > MaxCollectionSize {
		return nil, fmt.Errorf("%w: blob is %d bytes (limit %d)", ErrNotCollection, size, MaxCollectionSize)
	}
	b := make([]byte, size)
	if _, err := r.ReadAt(b, 0); err != nil && !(err == io.EOF && size == 0) {
		return nil, err
	}
	return ParseCollection(b)
}
