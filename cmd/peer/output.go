package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// errExists is returned when -o names a file that exists and --force was
// not given.
var errExists = errors.New("exists (give --force to replace it)")

// writeOut writes r to path, or to standard output for "-".
//
//   - A path that does not exist is created atomically (a temporary file in
//     the same directory, synced, then renamed), with the usual 0666 &^ umask
//     mode.
//   - An existing regular file is replaced the same way only with force, and
//     keeps its mode.
//   - A symbolic link is followed: the rules apply to its target, so the link
//     stays and the file it names is written.
//   - A device, FIFO or other non-regular file (/dev/null, /dev/stdout, a
//     named pipe) is written through, never replaced.
//   - A directory is refused.
func writeOut(path string, r io.WriterTo, force bool) (int64, error) {
	if path == "-" {
		return r.WriteTo(os.Stdout)
	}
	target, err := followLinks(path)
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return replaceFile(target, r, 0)
	case err != nil:
		return 0, err
	case fi.IsDir():
		return 0, fmt.Errorf("%s: is a directory", path)
	case fi.Mode().IsRegular():
		if !force {
			return 0, fmt.Errorf("%s: %w", path, errExists)
		}
		return replaceFile(target, r, fi.Mode().Perm())
	default:
		return writeThrough(target, r)
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

// writeThrough writes r into an existing non-regular file without
// truncating or replacing it.
func writeThrough(path string, r io.WriterTo) (int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	n, err := r.WriteTo(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// replaceFile writes r to a temporary file beside path, syncs it and
// renames it over path. mode 0 means a new file's default mode (0666 &^
// umask); otherwise the temporary file is given mode before the rename.
func replaceFile(path string, r io.WriterTo, mode fs.FileMode) (int64, error) {
	f, err := createTemp(path)
	if err != nil {
		return 0, err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly after the rename
	n, err := r.WriteTo(f)
	if err == nil && mode != 0 {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	return n, err
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
