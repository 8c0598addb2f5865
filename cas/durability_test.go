package cas

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// fsEvent is one durability step the store took.
type fsEvent struct {
	op      string // syncFile, syncDir, rename, commit
	path    string // the file or directory; for rename the old path
	newpath string // rename: the new path
	c       CID    // commit: the blob published
}

// recordFS makes s record its durability steps, still taking them.
func recordFS(s *Store) func() []fsEvent {
	var mu sync.Mutex
	var log []fsEvent
	add := func(e fsEvent) {
		mu.Lock()
		log = append(log, e)
		mu.Unlock()
	}
	real := s.fs
	s.fs = fileOps{
		syncFile: func(f *os.File) error {
			err := real.syncFile(f)
			add(fsEvent{op: "syncFile", path: f.Name()})
			return err
		},
		syncDir: func(dir string) error {
			err := real.syncDir(dir)
			add(fsEvent{op: "syncDir", path: dir})
			return err
		},
		rename: func(oldpath, newpath string) error {
			add(fsEvent{op: "rename", path: oldpath, newpath: newpath})
			return real.rename(oldpath, newpath)
		},
		committed: func(c CID) { add(fsEvent{op: "commit", c: c}) },
	}
	return func() []fsEvent {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(log)
	}
}

// checkDurable checks that each blob in want was published in the order
// that survives a crash at any point: its data file and its outboard each
// synced before being renamed into place, both renames before their
// directories are synced, and those syncs before the index commit that
// names the blob.
func checkDurable(t *testing.T, s *Store, log []fsEvent, want []CID) {
	t.Helper()
	find := func(from, to int, match func(fsEvent) bool) int {
		for i := to - 1; i >= from; i-- {
			if match(log[i]) {
				return i
			}
		}
		return -1
	}
	var b strings.Builder
	for _, e := range log {
		b.WriteString("\n  " + e.op + " " + strings.TrimPrefix(e.path, s.Dir()) + " " + strings.TrimPrefix(e.newpath, s.Dir()) + " " + e.c.String())
	}
	for _, c := range want {
		commit := find(0, len(log), func(e fsEvent) bool { return e.op == "commit" && e.c == c })
		if commit < 0 {
			t.Fatalf("%s: no index commit recorded; log:%s", c, b.String())
		}
		for _, dst := range []string{s.blobPath(c), s.outboardPath(c)} {
			ren := find(0, commit, func(e fsEvent) bool { return e.op == "rename" && e.newpath == dst })
			if ren < 0 {
				t.Fatalf("%s: no rename into %s before the index commit; log:%s", c, dst, b.String())
			}
			src := log[ren].path
			if find(0, ren, func(e fsEvent) bool { return e.op == "syncFile" && e.path == src }) < 0 {
				t.Errorf("%s: %s renamed into place before it was synced; log:%s", c, src, b.String())
			}
			if find(ren+1, commit, func(e fsEvent) bool { return e.op == "syncDir" && e.path == filepath.Dir(dst) }) < 0 {
				t.Errorf("%s: %s not synced between the rename into it and the index commit; log:%s", c, filepath.Dir(dst), b.String())
			}
		}
	}
}

// Durability is ordered, and it is real: for Put, AddFile (shards and
// collection) and Partial.Finish, data is synced before it is renamed, the
// rename before its directory is synced, and that before the index commits;
// and the index itself is synced (bbolt NoSync off).
func TestDurabilityOrder(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if s.db.NoSync || s.opt.NoSync {
		t.Fatalf("index NoSync %v, store NoSync %v; want both off by default", s.db.NoSync, s.opt.NoSync)
	}
	t.Run("Put", func(t *testing.T) {
		log := recordFS(s)
		inf := put(t, s, randData(70, 3*GroupSize+5))
		checkDurable(t, s, log(), []CID{inf.CID})
	})
	t.Run("AddFile", func(t *testing.T) {
		log := recordFS(s)
		data := randData(71, ShardSize+GroupSize)
		path := filepath.Join(t.TempDir(), "big")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		inf, err := s.AddFile(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		col, err := s.Collection(inf.CID)
		if err != nil {
			t.Fatal(err)
		}
		checkDurable(t, s, log(), append(col.children(), inf.CID))
	})
	t.Run("Finish", func(t *testing.T) {
		src := newStore(t)
		data := randData(72, 5*GroupSize)
		c := put(t, src, data).CID
		log := recordFS(s)
		p, err := s.OpenPartial(c, int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		slice, _ := src.AppendSlice(nil, c, 0, int64(len(data)))
		if err := p.WriteSlice(0, int64(len(data)), slice); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Finish(ctx); err != nil {
			t.Fatal(err)
		}
		checkDurable(t, s, log(), []CID{c})
		back := make([]byte, len(data))
		if _, err := s.ReadAt(c, back, 0); err != nil || !bytes.Equal(back, data) {
			t.Fatalf("finished blob: %v", err)
		}
	})
}
