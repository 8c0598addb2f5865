package browser

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"sync"
)

// Files is the page's storage as a Store uses it: whole files by name,
// each written at once. Browsers have no cheap way to write in the middle
// of a big file from a page (OPFS's createWritable copies the file it
// opens), so a Store keeps a blob as one file per 1 MiB piece, written
// once it is verified. Implementations are safe for concurrent use; ctx
// bounds the wait for the page's storage.
type Files interface {
	// Write creates or replaces file name with data. data is not kept.
	Write(ctx context.Context, name string, data []byte) error
	// Read returns up to n bytes of file name from off (fewer at its
	// end), or an error wrapping fs.ErrNotExist if there is no such file.
	Read(ctx context.Context, name string, off, n int64) ([]byte, error)
	// Remove deletes file name; a missing file is not an error.
	Remove(ctx context.Context, name string) error
	// List returns the names of every file.
	List(ctx context.Context) ([]string, error)
}

// MemFiles is Files in memory: what a page without persistent storage
// keeps until it closes, and what tests use. Safe for concurrent use.
type MemFiles struct {
	mu sync.Mutex
	m  map[string][]byte
}

// NewMemFiles returns empty Files in memory.
func NewMemFiles() *MemFiles { return &MemFiles{m: map[string][]byte{}} }

func (f *MemFiles) Write(ctx context.Context, name string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[name] = slices.Clone(data)
	return nil
}

func (f *MemFiles) Read(ctx context.Context, name string, off, n int64) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.m[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
	}
	if off < 0 || n < 0 {
		return nil, fmt.Errorf("%s: read [%d, +%d)", name, off, n)
	}
	if off >= int64(len(b)) {
		return nil, nil
	}
	return slices.Clone(b[off:min(int64(len(b)), off+n)]), nil
}

func (f *MemFiles) Remove(ctx context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, name)
	return nil
}

func (f *MemFiles) List(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, 0, len(f.m))
	for k := range f.m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

// Corrupt flips one bit of file name at off, for tests of what a Store
// does with storage that changed under it. It reports whether the byte
// existed.
func (f *MemFiles) Corrupt(name string, off int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.m[name]
	if !ok || off < 0 || off >= int64(len(b)) {
		return false
	}
	b[off] ^= 1
	return true
}
