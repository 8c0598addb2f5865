package cas

import (
	"os"

	"golang.org/x/sys/unix"
)

// startWriteback asks the kernel to start writing [off, off+n) of f back
// to disk without waiting, so that the fsync at the end has little left to
// do. It is only a hint: errors surface at that fsync.
func startWriteback(f *os.File, off, n int64) {
	unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// willNeed asks the kernel to start reading [off, off+n) of f into the
// page cache now, in large requests, so that readers working on parts of
// the range in parallel find it arriving instead of each starting its own
// small readahead. Only a hint.
func willNeed(f *os.File, off, n int64) {
	unix.Fadvise(int(f.Fd()), off, n, unix.FADV_WILLNEED)
}
