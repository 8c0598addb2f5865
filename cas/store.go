//go:build !js

package cas

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/rdrr/peer/cas/bao"
	bolt "go.etcd.io/bbolt"
)

// Options configures a Store. The zero value is usable.
type Options struct {
	// Logger receives warnings (cleaned leftovers, corrupt blobs). Nil
	// discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// LockTimeout is how long Open waits for another process to release
	// index.db before failing with ErrLocked. Zero means 2 s.
	LockTimeout time.Duration
	// OutboardCache is how many outboards are kept in memory for verified
	// reads (each is 0.4% of its blob: 256 KiB for a 64 MiB shard). Zero
	// means 256.
	OutboardCache int
	// NoSync skips fsync. Only for benchmarks that measure hashing rather
	// than the disk; a crash can then leave a blob indexed but not on disk.
	NoSync bool
	// KeepDownloadCache keeps every page a download writes in the page
	// cache. By default a download's periodic flush drops the pages of
	// what the flush before it made durable (Partial.evictOld), and a blob
	// a download finished is dropped coolFor later (dropCooled), so that
	// downloads hold a window of the page cache, not whole blobs. Nothing
	// is dropped with NoSync (the pages stay dirty).
	KeepDownloadCache bool
}

// Store is a content-addressed store of blobs on local disk. Every byte it
// returns has been verified against its CID (the Unchecked methods, for
// servers whose receivers verify, return bytes verified when they were
// stored and not since); a blob is either absent or
// whole and correct, whatever the moment of a crash. A Store is safe for
// concurrent use; one process at a time can open a home.
type Store struct {
	dir string
	db  *bolt.DB
	opt Options
	log *slog.Logger
	fs  fileOps

	obCache *lru.Cache[Digest, []byte]

	// commit serializes the rename-and-index step of Put/Finish against
	// deletions, so that GC never removes a file a commit is publishing.
	commit sync.Mutex

	mu       sync.Mutex
	closed   bool
	accessed map[Digest]int64 // last-access times not yet written to the index

	pmu      sync.Mutex          // guards partials and each Partial's refs
	partials map[Digest]*Partial // by digest: both codecs share one download
	// closing: downloads whose last holder is closing them, until their
	// final flush has ended (releaseLocked); OpenPartial waits for them.
	closing map[Digest]chan struct{}
	shut    bool // Close has taken the list of partials: OpenPartial fails

	cmu     sync.Mutex
	cooling []cooling // blobs downloads finished, oldest first (dropCooled)
}

// Layout of a home.
const (
	dirBlobs     = "blobs"
	dirOutboards = "outboards"
	dirPartial   = "partial"
	dirTmp       = "tmp"
	indexFile    = "index.db"
)

// Open opens (creating if needed) the store in home. It removes leftovers
// of interrupted writes: temporary files, and blob files that no index entry
// names (a crash between rename and index commit).
func Open(home string, opt Options) (*Store, error) { return open(home, opt, osFileOps()) }

// open is Open with the file-system steps given (tests record them).
func open(home string, opt Options, fs fileOps) (*Store, error) {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.LockTimeout == 0 {
		opt.LockTimeout = 2 * time.Second
	}
	if opt.OutboardCache == 0 {
		opt.OutboardCache = 256
	}
	log := opt.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, d := range []string{dirBlobs, dirOutboards, dirPartial, dirTmp} {
		if err := os.MkdirAll(filepath.Join(home, d), 0o755); err != nil {
			return nil, fmt.Errorf("open store: %w", err)
		}
	}
	path := filepath.Join(home, indexFile)
	db, err := bolt.Open(path, 0o644, &bolt.Options{Timeout: opt.LockTimeout, NoSync: opt.NoSync})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open %s: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("open %s: index is unreadable (%v); move it aside and the next open rebuilds it from blobs/ (pins are lost)", path, err)
	}
	if err := db.Update(initBuckets); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	cache, _ := lru.New[Digest, []byte](opt.OutboardCache)
	s := &Store{
		dir:      home,
		db:       db,
		opt:      opt,
		log:      log,
		fs:       fs,
		obCache:  cache,
		accessed: map[Digest]int64{},
		partials: map[Digest]*Partial{},
		closing:  map[Digest]chan struct{}{},
	}
	if err := s.clean(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

// Dir returns the store's home directory.
func (s *Store) Dir() string { return s.dir }

// Close flushes pending access times and open partial downloads and
// closes the index.
func (s *Store) Close() error {
	if err := s.checkOpen(); err != nil {
		return nil
	}
	s.pmu.Lock()
	s.shut = true // no OpenPartial from now on: these lists are all there is
	partials := make([]*Partial, 0, len(s.partials))
	for _, p := range s.partials {
		partials = append(partials, p)
	}
	// Downloads whose last holder is closing them right now: their final
	// flush writes the record and the outboard, so the index must stay
	// open until it is done (a daemon stopping while a fetch closes its
	// downloads lost what it had verified since the last periodic flush).
	closing := make([]chan struct{}, 0, len(s.closing))
	for _, ch := range s.closing {
		closing = append(closing, ch)
	}
	s.pmu.Unlock()
	var errs []error
	for _, p := range partials {
		p.mu.Lock()
		errs = append(errs, p.releaseLocked(true)) // the store is closing
		p.mu.Unlock()
	}
	for _, ch := range closing {
		<-ch
	}
	errs = append(errs, s.flushAccess())
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	errs = append(errs, s.db.Close())
	return errors.Join(errs...)
}

func (s *Store) blobPath(c CID) string {
	h := c.Hex()
	return filepath.Join(s.dir, dirBlobs, h[:2], h)
}

func (s *Store) outboardPath(c CID) string {
	h := c.Hex()
	return filepath.Join(s.dir, dirOutboards, h[:2], h+".obao")
}

func (s *Store) partialPath(c CID, ext string) string {
	return filepath.Join(s.dir, dirPartial, c.Hex()+ext)
}

func (s *Store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return nil
}

// clean removes temporary files and partial-download files that no index
// entry names, and adopts blob files that the index does not name: a crash
// between rename and index commit leaves a whole, synced blob, and a lost
// index.db is rebuilt this way (pins excepted). An adopted file is re-hashed
// first; one that does not hash to its name is removed.
func (s *Store) clean() error {
	tmp := filepath.Join(s.dir, dirTmp)
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, e := range ents {
		s.log.Info("removing leftover temporary file", "file", e.Name())
		if err := os.RemoveAll(filepath.Join(tmp, e.Name())); err != nil {
			return err
		}
	}
	var orphans []string
	err = s.db.View(func(tx *bolt.Tx) error {
		blobs, partial := tx.Bucket(bucketBlobs), tx.Bucket(bucketPartial)
		known := func(name string, b *bolt.Bucket) bool {
			name, _, _ = strings.Cut(name, ".")
			c, err := ParseCID(name)
			return err == nil && b.Get(c.key()) != nil
		}
		err := filepath.WalkDir(filepath.Join(s.dir, dirBlobs), func(path string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && !known(e.Name(), blobs) {
				orphans = append(orphans, path)
			}
			return err
		})
		if err != nil {
			return err
		}
		ents, err := os.ReadDir(filepath.Join(s.dir, dirPartial))
		if err != nil {
			return err
		}
		for _, e := range ents {
			if !known(e.Name(), partial) {
				if err := os.Remove(filepath.Join(s.dir, dirPartial, e.Name())); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, path := range orphans {
		if err := s.adopt(path); err != nil {
			return err
		}
	}
	// Downloads that finished just before a crash left their record (after
	// adoption, which may have indexed the finished blob).
	err = s.db.Update(func(tx *bolt.Tx) error {
		blobs, partial := tx.Bucket(bucketBlobs), tx.Bucket(bucketPartial)
		var done [][]byte
		partial.ForEach(func(k, _ []byte) error {
			if blobs.Get(k) != nil {
				done = append(done, k)
			}
			return nil
		})
		for _, k := range done {
			if err := partial.Delete(k); err != nil {
				return err
			}
			os.Remove(s.partialPath(RawCID(Digest(k)), ".data"))
			os.Remove(s.partialPath(RawCID(Digest(k)), ".obao"))
		}
		return nil
	})
	if err != nil {
		return err
	}
	// Outboards of blobs that are gone.
	return s.db.View(func(tx *bolt.Tx) error {
		blobs := tx.Bucket(bucketBlobs)
		return filepath.WalkDir(filepath.Join(s.dir, dirOutboards), func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() {
				return err
			}
			name, _, _ := strings.Cut(e.Name(), ".")
			if c, perr := ParseCID(name); perr != nil || blobs.Get(c.key()) == nil {
				s.log.Info("removing outboard of a blob that is not indexed", "file", path)
				return os.Remove(path)
			}
			return nil
		})
	})
}

// adopt indexes the unindexed blob file at path if it hashes to its name,
// and removes it otherwise. The file stays where it is (a crash while
// adopting leaves it to the next Open, never loses it) and is synced with
// its directory before the index names it: the rename that put it there
// may not have been durable yet.
func (s *Store) adopt(path string) error {
	c, err := ParseCID(filepath.Base(path))
	if err != nil || path != s.blobPath(c) {
		s.log.Warn("removing stray file in blobs/", "file", path)
		return os.Remove(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	var enc bao.Encoder
	_, err = io.Copy(&enc, f)
	if err == nil {
		err = s.syncFile(f)
	}
	f.Close()
	if err != nil {
		return fmt.Errorf("adopt %s: %w", path, err)
	}
	root, ob := enc.Sum(nil)
	if Digest(root) != c.Digest() {
		s.log.Warn("removing unindexed blob file that does not hash to its name", "file", path)
		return os.Remove(path)
	}
	s.log.Info("indexing blob file that the index did not name", "cid", c, "size", enc.Size())
	_, err = s.commitBlob(c, enc.Size(), path, ob, nil)
	return err
}

func (s *Store) info(tx *bolt.Tx, c CID, r record) Info {
	acc := r.Accessed
	s.mu.Lock()
	if a, ok := s.accessed[c.Digest()]; ok && a > acc {
		acc = a
	}
	s.mu.Unlock()
	return Info{
		CID:        c,
		Size:       r.Size,
		Collection: c.IsCollection(),
		Corrupt:    r.Flags&flagCorrupt != 0,
		Added:      time.Unix(0, r.Added),
		Accessed:   time.Unix(0, acc),
		Verified:   time.Unix(0, r.Verified),
		Pins:       pinsOf(tx, c),
		Refs:       getRefs(tx, c),
	}
}

// Stat returns what the index knows of c, or an error wrapping ErrNotFound.
// A raw CID is stored when its bytes are; a collection CID only when its
// bytes are held as a collection (added or fetched through that CID), never
// merely because the bytes of a raw blob parse as one.
func (s *Store) Stat(c CID) (Info, error) {
	if err := s.checkOpen(); err != nil {
		return Info{}, err
	}
	var inf Info
	err := s.db.View(func(tx *bolt.Tx) error {
		r, ok, err := getView(tx, c)
		if err != nil {
			return err
		}
		if !ok {
			return notFound(c)
		}
		inf = s.info(tx, c, r)
		return nil
	})
	return inf, err
}

// Has reports whether c is stored (and not known to be corrupt).
func (s *Store) Has(c CID) bool {
	inf, err := s.Stat(c)
	return err == nil && !inf.Corrupt
}

// List calls fn for every stored blob in digest order, stopping at the
// first error fn returns: by its collection CID if the blob is held as a
// collection (and then by its raw CID too if that is pinned), else by its
// raw CID. fn must not call back into the Store's write methods.
func (s *Store) List(fn func(Info) error) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	return s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBlobs).ForEach(func(k, v []byte) error {
			r, err := unmarshalRecord(v)
			if err != nil {
				return fmt.Errorf("index entry %x: %w", k, err)
			}
			raw := RawCID(Digest(k))
			if r.Flags&flagCollection != 0 {
				if err := fn(s.info(tx, CollectionCID(raw.Digest()), r)); err != nil {
					return err
				}
				if len(pinsOf(tx, raw)) == 0 {
					return nil
				}
			}
			return fn(s.info(tx, raw, r))
		})
	})
}

// touch records an access to c, written to the index lazily.
func (s *Store) touch(c CID) {
	s.mu.Lock()
	s.accessed[c.Digest()] = s.opt.Now().UnixNano()
	n := len(s.accessed)
	s.mu.Unlock()
	if n >= 4096 {
		s.flushAccess()
	}
}

// flushAccess writes pending access times to the index. Losing them in a
// crash only makes GC's LRU order slightly stale.
func (s *Store) flushAccess() error {
	s.mu.Lock()
	pending := s.accessed
	s.accessed = map[Digest]int64{}
	s.mu.Unlock()
	if len(pending) == 0 {
		return nil
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for d, t := range pending {
			c := RawCID(d)
			r, ok, err := getRecord(tx, c)
			if err != nil || !ok || r.Accessed >= t {
				continue
			}
			r.Accessed = t
			if err := putRecord(tx, c, &r); err != nil {
				return err
			}
		}
		return nil
	})
}

// syncDir makes a rename or unlink in dir durable.
func (s *Store) syncDir(dir string) error {
	if s.opt.NoSync {
		return nil
	}
	return s.fs.syncDir(dir)
}

// syncFile makes f's data durable.
func (s *Store) syncFile(f *os.File) error {
	if s.opt.NoSync {
		return nil
	}
	return s.fs.syncFile(f)
}

// fileOps are the file-system steps that make a write durable. The store
// takes them in one order (data synced, renamed into place, directory
// synced, then the index commits); tests replace them to check that order
// (TestDurabilityOrder).
type fileOps struct {
	syncFile func(f *os.File) error
	syncDir  func(dir string) error
	rename   func(oldpath, newpath string) error
	// committed is called once an index transaction that publishes the
	// blob c has committed (bbolt has synced it).
	committed func(c CID)
}

func osFileOps() fileOps {
	return fileOps{
		syncFile: (*os.File).Sync,
		syncDir: func(dir string) error {
			d, err := os.Open(dir)
			if err != nil {
				return err
			}
			defer d.Close()
			return d.Sync()
		},
		rename:    os.Rename,
		committed: func(CID) {},
	}
}
