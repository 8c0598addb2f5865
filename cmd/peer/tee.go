package main

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/rdrr/peer/cas"
)

// teeOut writes a collection being fetched into an output as its shards'
// pieces are verified (swarm.FetchOptions.Verified), each at its places
// in the file, and remembers which groups it wrote; fill then writes the
// rest (what the store held before the fetch) from verified reads of the
// store. Without it, `peer get -o` read the whole file back from the
// store after the fetch and verified every group a second time: 5.6 of a
// 1 -> 9's 83 CPU-seconds (swarm/BENCHMARKS.md).
type teeOut struct {
	w      io.WriterAt
	st     *cas.Store
	root   cas.CID
	cancel context.CancelCauseFunc // stops the fetch when the output fails

	mu    sync.Mutex
	at    map[cas.CID][]int64  // each shard's offsets in the file (a repeated region: several); nil until the first piece
	size  map[cas.CID]int64    // each shard's size
	wrote map[cas.CID][]uint64 // groups written, a bit each, by shard
	err   error
}

func newTeeOut(w io.WriterAt, st *cas.Store, root cas.CID, cancel context.CancelCauseFunc) *teeOut {
	return &teeOut{w: w, st: st, root: root, cancel: cancel, wrote: map[cas.CID][]uint64{}}
}

// verified takes the data at off of blob, verified: if blob is a shard of
// the file, it is written at each of its places. The root's own bytes (a
// collection's list, or a blob that is the whole file) are left to fill.
func (t *teeOut) verified(blob cas.CID, off int64, data []byte) {
	if blob == t.root || !t.root.IsCollection() {
		return
	}
	t.mu.Lock()
	if t.at == nil && t.err == nil {
		if err := t.layout(); err != nil {
			t.mu.Unlock()
			t.fail(err)
			return
		}
	}
	offs, size, err := t.at[blob], t.size[blob], t.err
	t.mu.Unlock()
	if err != nil || len(offs) == 0 || off < 0 || off+int64(len(data)) > size {
		return // not a shard of the file, or not within it: fill writes what is missing
	}
	for _, at := range offs {
		if _, err := t.w.WriteAt(data, at+off); err != nil {
			t.fail(fmt.Errorf("output: %w", err))
			return
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	bits := t.wrote[blob]
	if bits == nil {
		bits = make([]uint64, (groups(t.size[blob])+63)/64)
		t.wrote[blob] = bits
	}
	for g := off / cas.GroupSize; g < groups(off+int64(len(data))); g++ {
		bits[g/64] |= 1 << (g % 64)
	}
}

// layout reads the root collection (complete and verified before any of
// its shards is fetched) for the shards' places. t.mu is held.
func (t *teeOut) layout() error {
	col, err := t.st.Collection(t.root)
	if err != nil {
		return err
	}
	t.at, t.size = map[cas.CID][]int64{}, map[cas.CID]int64{}
	var at int64
	for _, sh := range col.Shards {
		t.at[sh.CID] = append(t.at[sh.CID], at)
		t.size[sh.CID] = sh.Size
		at += sh.Size
	}
	return nil
}

func (t *teeOut) fail(err error) {
	t.mu.Lock()
	if t.err == nil {
		t.err = err
	}
	t.mu.Unlock()
	t.cancel(err)
}

// groups is the number of 16 KiB groups in n bytes.
func groups(n int64) int64 { return (n + cas.GroupSize - 1) / cas.GroupSize }

// fill writes what verified did not (everything, for a blob that is not a
// collection) from verified reads of the complete file fr. It returns the
// file's size and how much of it verified wrote.
func (t *teeOut) fill(fr *cas.FileReader) (size, streamed int64, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return 0, 0, t.err
	}
	if !t.root.IsCollection() {
		n, err := fr.WriteTo(io.NewOffsetWriter(t.w, 0))
		return n, 0, err
	}
	buf := make([]byte, 1<<20)
	var start, filled int64
	for _, sh := range fr.Shards() {
		bits := t.wrote[sh.CID] // nil: nothing of it written
		has := func(g int64) bool { return bits != nil && bits[g/64]&(1<<(g%64)) != 0 }
		n := groups(sh.Size)
		for g := int64(0); g < n; {
			if has(g) {
				g++
				continue
			}
			end := g + 1
			for end < n && !has(end) && (end-g+1)*cas.GroupSize <= int64(len(buf)) {
				end++
			}
			off := g * cas.GroupSize
			b := buf[:min(end*cas.GroupSize, sh.Size)-off]
			if _, err := t.st.ReadAt(sh.CID, b, off); err != nil {
				return 0, 0, err
			}
			if _, err := t.w.WriteAt(b, start+off); err != nil {
				return 0, 0, fmt.Errorf("output: %w", err)
			}
			filled += int64(len(b))
			g = end
		}
		start += sh.Size
	}
	return fr.Size(), fr.Size() - filled, nil
}
