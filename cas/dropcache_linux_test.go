package cas

import (
	"os"

	"golang.org/x/sys/unix"
)

// dropCache evicts path's clean pages from the page cache
// (posix_fadvise DONTNEED), so the next read comes from the disk. It
// touches no other file, unlike writing to /proc/sys/vm/drop_caches.
func dropCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // dirty pages are not dropped
		return err
	}
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}
