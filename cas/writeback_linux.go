package cas

import (
	"io"
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

// dropPages asks the kernel to drop the clean pages of [off, off+n) of f
// from the page cache. Dirty ones stay (the kernel starts writing them
// back; an error there is reported by the next fsync). Only a hint.
func dropPages(f *os.File, off, n int64) {
	unix.Fadvise(int(f.Fd()), off, n, unix.FADV_DONTNEED)
}

// writeAtv writes bufs one after another at off of f, in one pwritev(2)
// (more only if the kernel writes less), so that data scattered in a
// buffer is written without first being gathered by a copy.
func writeAtv(f *os.File, bufs [][]byte, off int64) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	for {
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
		if len(bufs) == 0 {
			return nil
		}
		var n int
		var werr error
		if err := rc.Write(func(fd uintptr) bool {
			n, werr = unix.Pwritev(int(fd), bufs, off)
			return werr != unix.EAGAIN
		}); err != nil {
			return &os.PathError{Op: "pwritev", Path: f.Name(), Err: os.ErrClosed}
		}
		switch {
		case werr == unix.EINTR:
			continue
		case werr != nil:
			return &os.PathError{Op: "pwritev", Path: f.Name(), Err: werr}
		case n == 0:
			return &os.PathError{Op: "pwritev", Path: f.Name(), Err: io.ErrShortWrite}
		}
		off += int64(n)
		for n > 0 {
			k := min(n, len(bufs[0]))
			n -= k
			if bufs[0] = bufs[0][k:]; len(bufs[0]) == 0 {
				bufs = bufs[1:]
			}
		}
	}
}
