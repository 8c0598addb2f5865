package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// errExists is returned when -o names a file that exists and --force was
// not given.
var errExists = errors.New("exists (give --force to replace it)")

// output is a file being written for the user (`peer get -o`), opened
// before what goes into it is fetched, so that a fetch can write its
// pieces into it as they arrive (when positional), and so that a refusal
// (an existing file without --force, a directory) comes before the
// fetch, not after it.
type output struct {
	f *os.File // nil for a named pipe until Writer opens it
	// positional: f takes writes at offsets (a file, /dev/null, a block
	// device), in any order; a pipe or a terminal does not.
	positional bool
	tmp, path  string      // a temporary file renamed over path by commit
	mode       fs.FileMode // given to tmp before the rename (0: the default)
	// noReplace: path did not exist and --force was not given, so a
	// file that appeared there meanwhile is not replaced.
	noReplace bool
	fifo      string // a named pipe, opened by Writer
	done      bool
}

// Writer returns the file to write, opening a named pipe now: opening
// one blocks until a reader comes, which must not hold up a fetch.
func (o *output) Writer() (*os.File, error) {
	if o.f == nil && o.fifo != "" {
		f, err := os.OpenFile(o.fifo, os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		o.f = f
	}
	return o.f, nil
}

// openOutput opens path for writing, or standard output for "-".
//
//   - A path that does not exist is created atomically (a temporary file in
//     the same directory, synced, then renamed by commit), with the usual
//     0666 &^ umask mode.
//   - An existing regular file is replaced the same way only with force, and
//     keeps its mode.
//   - A symbolic link is followed: the rules apply to its target, so the link
//     stays and the file it names is written.
//   - A device, FIFO or other non-regular file (/dev/null, /dev/stdout, a
//     named pipe) is written through, never replaced.
//   - A directory is refused.
func openOutput(path string, force bool) (*output, error) {
	if path == "-" {
		return &output{f: os.Stdout, done: true}, nil
	}
	target, err := followLinks(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(target)
	var mode fs.FileMode
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case fi.IsDir():
		return nil, fmt.Errorf("%s: is a directory", path)
	case fi.Mode().IsRegular():
		if !force {
			return nil, fmt.Errorf("%s: %w", path, errExists)
		}
		mode = fi.Mode().Perm()
	case fi.Mode()&fs.ModeNamedPipe != 0:
		return &output{fifo: target}, nil // written through, opened by Writer
	default:
		// Written through, without truncating or replacing it.
		f, err := os.OpenFile(target, os.O_WRONLY, 0)
		if err != nil {
			return nil, err
		}
		return &output{f: f, positional: positional(f)}, nil
	}
	f, err := createTemp(target)
	if err != nil {
		return nil, err
	}
	return &output{f: f, positional: true, tmp: f.Name(), path: target, mode: mode, noReplace: mode == 0}, nil
}

// positional reports whether f takes writes at offsets: the kernel refuses
// a positional write of nothing (ESPIPE) to a pipe, socket or terminal.
func positional(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		_, werr = unix.Pwrite(int(fd), nil, 0)
		return true
	}); err != nil {
		return false
	}
	return werr == nil
}

// commit finishes the output: a temporary file is given its mode, synced
// and renamed over the path; a file written through is closed.
func (o *output) commit() error {
	if o.done {
		return nil
	}
	o.done = true
	if o.f == nil {
		return nil // a named pipe never opened
	}
	var err error
	if o.tmp != "" && o.mode != 0 {
		err = o.f.Chmod(o.mode)
	}
	if o.tmp != "" && err == nil {
		err = o.f.Sync()
	}
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	if o.tmp != "" && err == nil {
		if o.noReplace {
			err = renameNoReplace(o.tmp, o.path)
		} else {
			err = os.Rename(o.tmp, o.path)
		}
	}
	if err != nil && o.tmp != "" {
		os.Remove(o.tmp)
	}
	return err
}

// renameNoReplace renames old to new unless new exists (a file made at
// the output path while a fetch ran is not replaced without --force).
func renameNoReplace(old, new string) error {
	err := unix.Renameat2(unix.AT_FDCWD, old, unix.AT_FDCWD, new, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// A file system without the flag: a hard link fails as well
		// when new exists.
		if err = os.Link(old, new); err == nil {
			return os.Remove(old)
		}
	}
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s: %w", new, errExists)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: old, New: new, Err: err}
	}
	return nil
}

// abort closes an output that was not committed, removing its temporary
// file. A no-op after commit.
func (o *output) abort() {
	if o.done {
		return
	}
	o.done = true
	if o.f == nil {
		return
	}
	o.f.Close()
	if o.tmp != "" {
		os.Remove(o.tmp)
	}
}

// followLinks returns the path that path's chain of symbolic links ends
// at, which need not exist yet (a link to a file still to be written).
func followLinks(path string) (string, error) {
	for range 40 { // as the kernel's ELOOP limit
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return path, nil
		}
		dest, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(path), dest)
		}
		path = dest
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", path)
}

// createTemp makes a new file beside path. Unlike os.CreateTemp (mode
// 0600) it asks for 0666 so that the umask decides, as for any file a
// command writes.
func createTemp(path string) (*os.File, error) {
	dir, base := filepath.Split(path)
	seed := time.Now().UnixNano()
	for i := range 100 {
		name := filepath.Join(dir, "."+base+".part-"+strconv.FormatInt(seed+int64(i)*7919, 36))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("%s: no free temporary name", path)
}

// checkAddable refuses what `peer add` cannot store as a file: it must be
// a regular file. Opening a FIFO would block until a writer appears (and
// then store whatever it wrote), a device could be endless; both are
// refused before anything opens them.
func checkAddable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file (%s)", path, fileKind(fi.Mode()))
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "mode " + m.String()
}
