//go:build !linux && !js

package cas

import "os"

// startWriteback is a no-op where sync_file_range(2) does not exist: the
// final fsync then does all the writing back. Only speed differs.
func startWriteback(f *os.File, off, n int64) {}

// willNeed is a no-op where posix_fadvise(2) is not used: readers then
// rely on the kernel's own readahead. Only speed differs.
func willNeed(f *os.File, off, n int64) {}

// dropPages is a no-op where posix_fadvise(2) is not used: a download's
// pages then stay cached until the kernel needs them. Only memory differs.
func dropPages(f *os.File, off, n int64) {}

// writeAtv writes bufs one after another at off of f, one write each
// where pwritev(2) is not used.
func writeAtv(f *os.File, bufs [][]byte, off int64) error {
	for _, b := range bufs {
		if _, err := f.WriteAt(b, off); err != nil {
			return err
		}
		off += int64(len(b))
	}
	return nil
}
