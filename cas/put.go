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
	"golang.org/x/sys/unix"
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
func (s *Store) Put(ctx context.Context, r io.Reader) (Info, error) {
	return s.put(ctx, r, 0, nil)
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
				unix.SyncFileRange(int(w.f.Fd()), w.synced, w.written-w.synced, unix.SYNC_FILE_RANGE_WRITE)
				w.synced = w.written
			}
		}
		w.free <- b[:cap(b)]
	}
	w.done <- err
}

// put stores r; flags are extra record flags (collection) and links the
// children it refers to, indexed in the same transaction.
func (s *Store) put(ctx context.Context, r io.Reader, flags uint32, links []CID) (Info, error) {
	st, err := s.stage(ctx, r)
	if err != nil {
		return Info{}, err
	}
	return st.commit(flags, links)
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
	st.cid, st.ob = CID(root), ob
	return st, nil
}

func (st *staged) discard() {
	st.f.Close()
	os.Remove(st.f.Name())
}

// commit makes the staged blob durable and indexes it.
func (st *staged) commit(flags uint32, links []CID) (Info, error) {
	defer st.discard() // no-op once renamed
	if err := st.s.syncFile(st.f); err != nil {
		return Info{}, fmt.Errorf("put: sync: %w", err)
	}
	if err := st.f.Close(); err != nil {
		return Info{}, fmt.Errorf("put: %w", err)
	}
	return st.s.commitBlob(st.cid, st.size, st.f.Name(), st.ob, flags, links)
}

// commitBlob publishes a verified blob: it writes the outboard, renames the
// data file into place, and indexes both in one transaction. dataTmp must
// already be synced. If the blob is already stored the new copy is dropped.
// A non-nil links replaces the blob's links in the same transaction.
func (s *Store) commitBlob(c CID, size int64, dataTmp string, ob []byte, flags uint32, links []CID) (Info, error) {
	s.commit.Lock()
	defer s.commit.Unlock()
	if inf, err := s.Stat(c); err == nil && !inf.Corrupt {
		s.touch(c)
		return inf, nil
	}
	if flags&flagCollection == 0 {
		if col := readCollection(dataTmp, size); col != nil {
			flags |= flagCollection
			links = col.children()
		}
	}
	obTmp, err := s.writeTemp(ob)
	if err != nil {
		return Info{}, err
	}
	defer os.Remove(obTmp)
	bp, op := s.blobPath(c), s.outboardPath(c)
	for _, p := range []string{bp, op} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return Info{}, fmt.Errorf("put %s: %w", c, err)
		}
	}
	if err := os.Rename(obTmp, op); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", c, err)
	}
	if err := os.Rename(dataTmp, bp); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", c, err)
	}
	if err := errors.Join(s.syncDir(filepath.Dir(bp)), s.syncDir(filepath.Dir(op))); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", c, err)
	}
	now := s.opt.Now().UnixNano()
	rec := record{Size: size, Added: now, Accessed: now, Verified: now, Flags: flags}
	var inf Info
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := putRecord(tx, c, &rec); err != nil {
			return err
		}
		if links != nil {
			if err := link(tx, c, links); err != nil {
				return err
			}
		}
		inf = s.info(tx, c, rec)
		return nil
	})
	if err != nil {
		// The files are unindexed; the next Open removes them.
		return Info{}, fmt.Errorf("put %s: index: %w", c, err)
	}
	s.obCache.Add(c, ob)
	return inf, nil
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

// readCollection returns the collection stored in the (verified) file at
// path, or nil if the file is not one. Collections are recognized wherever
// they come from (add, fetch), so their shards are always linked.
func readCollection(path string, size int64) *Collection {
	if size < int64(len(collectionMagic)) || size > ShardSize {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	head := make([]byte, len(collectionMagic))
	if _, err := io.ReadFull(f, head); err != nil || !IsCollection(head) {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	col, err := ParseCollection(b)
	if err != nil {
		return nil
	}
	return col
}
