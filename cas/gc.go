//go:build !js

package cas

import (
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// Pin reasons used by the project. Any non-empty reason without '/' works.
const (
	PinUser     = "user"
	PinManifest = "manifest"
	PinKernel   = "kernel"
)

// Pin keeps c from GC for the given reason. c must be stored. Pinning a
// collection CID keeps the collection blob and its shards; pinning the raw
// CID of the same bytes keeps only the blob.
func (s *Store) Pin(c CID, reason string) error {
	if reason == "" || strings.ContainsAny(reason, "/\x00") || len(reason) > 64 {
		return fmt.Errorf("pin %s: bad reason %q", c, reason)
	}
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.statCollection(c) // a collection whose bytes are held as raw only
	return s.db.Update(func(tx *bolt.Tx) error {
		if _, ok, err := getView(tx, c); err != nil || !ok {
			return errors.Join(err, notFound(c))
		}
		return tx.Bucket(bucketPins).Put(pinKey(c, reason), binary.LittleEndian.AppendUint64(nil, uint64(s.opt.Now().UnixNano())))
	})
}

// Unpin removes one reason for keeping c; an empty reason removes them all.
// It reports whether any pin was removed.
func (s *Store) Unpin(c CID, reason string) (bool, error) {
	if err := s.checkOpen(); err != nil {
		return false, err
	}
	removed := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketPins)
		for _, p := range pinsOf(tx, c) {
			if reason == "" || p.Reason == reason {
				if err := b.Delete(pinKey(c, p.Reason)); err != nil {
					return err
				}
				removed = true
			}
		}
		return nil
	})
	return removed, err
}

// Link records that parent refers to children (a collection its shards, a
// manifest its shards and kernels). Children need not be stored yet; while
// parent is stored, GC keeps them. Links belong to the parent's bytes
// (its digest), whatever its codec, and children are linked by digest.
// Linking a parent again replaces its children.
func (s *Store) Link(parent CID, children []CID) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error { return link(tx, parent, children) })
}

func link(tx *bolt.Tx, parent CID, children []CID) error {
	for _, old := range linksOf(tx, parent) {
		if err := addRefs(tx, old, -1); err != nil {
			return err
		}
	}
	v := make([]byte, 0, 32*len(children))
	for _, c := range children {
		v = append(v, c.key()...)
		if err := addRefs(tx, c, 1); err != nil {
			return err
		}
	}
	if len(children) == 0 {
		return tx.Bucket(bucketLinks).Delete(parent.key())
	}
	return tx.Bucket(bucketLinks).Put(parent.key(), v)
}

// Links returns the children recorded for parent.
func (s *Store) Links(parent CID) ([]CID, error) {
	var out []CID
	err := s.db.View(func(tx *bolt.Tx) error { out = linksOf(tx, parent); return nil })
	return out, err
}

// Delete removes c's data and index entry, whatever c's codec: the raw and
// the collection CID of the same bytes are one blob (its pins stay, so a
// re-added or re-fetched copy is pinned again). Links from c are dropped.
func (s *Store) Delete(c CID) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.commit.Lock()
	defer s.commit.Unlock()
	return s.deleteLocked(c)
}

func (s *Store) deleteLocked(c CID) error {
	found := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		_, ok, err := getRecord(tx, c)
		if err != nil || !ok {
			return err
		}
		found = true
		if err := link(tx, c, nil); err != nil {
			return err
		}
		return tx.Bucket(bucketBlobs).Delete(c.key())
	})
	if err != nil {
		return fmt.Errorf("delete %s: %w", c, err)
	}
	if !found {
		return notFound(c)
	}
	s.obCache.Remove(c.Digest())
	// The index no longer names the files; if removing them fails, the
	// next Open removes them.
	bp, op := s.blobPath(c), s.outboardPath(c)
	err = errors.Join(ignoreMissing(os.Remove(bp)), ignoreMissing(os.Remove(op)))
	s.syncDir(filepath.Dir(bp))
	return err
}

func ignoreMissing(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// GCReport says what a GC did.
type GCReport struct {
	Before  int64 `json:"bytes_before"`
	After   int64 `json:"bytes_after"`
	Removed []CID `json:"removed"`
	Freed   int64 `json:"bytes_freed"`
	// Kept is the bytes that pins and links keep, which no GC can free.
	Kept int64 `json:"bytes_kept"`
}

type gcItem struct {
	c    CID   // a raw CID: the blob goes; a collection CID: only its links go
	size int64 // bytes removing it frees
	acc  int64
}

type gcHeap []gcItem

func (h gcHeap) Len() int           { return len(h) }
func (h gcHeap) Less(i, j int) bool { return h[i].acc < h[j].acc }
func (h gcHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *gcHeap) Push(x any)        { *h = append(*h, x.(gcItem)) }
func (h *gcHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// gcCandidate says what GC may remove of the blob d: the whole blob if
// nothing pins or links it; only its collection view (its links to its
// shards) if it is held as a collection whose collection CID is unpinned
// while its raw CID is pinned; nothing otherwise.
func gcCandidate(tx *bolt.Tx, d Digest, r record) (gcItem, bool) {
	raw, col := RawCID(d), CollectionCID(d)
	if getRefs(tx, raw) > 0 {
		return gcItem{}, false
	}
	rawPins, colPins := len(pinsOf(tx, raw)), len(pinsOf(tx, col))
	switch {
	case rawPins == 0 && colPins == 0:
		return gcItem{c: raw, size: r.Size, acc: r.Accessed}, true
	case colPins == 0 && r.Flags&flagCollection != 0:
		return gcItem{c: col, size: 0, acc: r.Accessed}, true
	}
	return gcItem{}, false
}

// GC removes blobs that are neither pinned nor linked from a stored
// parent, least recently used first, until the store holds at most budget
// bytes. A negative budget removes every such blob. Removing a parent
// (a collection) may make its children removable in the same pass. A
// blob whose raw CID is pinned but whose collection CID is not loses its
// collection view (Removed lists the collection CID, and no bytes are
// freed), so its shards may go.
func (s *Store) GC(ctx context.Context, budget int64) (GCReport, error) {
	if err := s.flushAccess(); err != nil {
		return GCReport{}, err
	}
	s.commit.Lock()
	defer s.commit.Unlock()
	var rep GCReport
	var h gcHeap
	stored := map[Digest]bool{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBlobs).ForEach(func(k, v []byte) error {
			r, err := unmarshalRecord(v)
			if err != nil {
				return err
			}
			rep.Before += r.Size
			stored[Digest(k)] = true
			if it, ok := gcCandidate(tx, Digest(k), r); ok {
				h = append(h, it)
			}
			return nil
		})
	})
	if err != nil {
		return rep, err
	}
	heap.Init(&h)
	total := rep.Before
	for h.Len() > 0 && (budget < 0 || total > budget) {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		it := heap.Pop(&h).(gcItem)
		children, _ := s.Links(it.c)
		if it.c.IsCollection() {
			if err := s.dropCollectionView(it.c); err != nil {
				return rep, err
			}
		} else {
			if err := s.deleteLocked(it.c); err != nil {
				return rep, err
			}
			delete(stored, it.c.Digest())
		}
		rep.Removed = append(rep.Removed, it.c)
		rep.Freed += it.size
		total -= it.size
		// Children that lost their last parent and are unpinned join the
		// candidates.
		err := s.db.View(func(tx *bolt.Tx) error {
			for _, ch := range children {
				if !stored[ch.Digest()] || slices.Contains(rep.Removed, ch) {
					continue
				}
				if r, ok, _ := getRecord(tx, ch); ok {
					if ci, ok := gcCandidate(tx, ch.Digest(), r); ok {
						heap.Push(&h, ci)
					}
				}
			}
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	rep.After = total
	for _, it := range h {
		rep.Kept -= it.size
	}
	rep.Kept += total
	return rep, nil
}

// dropCollectionView unlinks the shards of the collection c and stops
// holding its blob as a collection; the blob stays (as raw).
func (s *Store) dropCollectionView(c CID) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		r, ok, err := getRecord(tx, c)
		if err != nil || !ok {
			return err
		}
		r.Flags &^= flagCollection
		if err := putRecord(tx, c, &r); err != nil {
			return err
		}
		return link(tx, c, nil)
	})
}
