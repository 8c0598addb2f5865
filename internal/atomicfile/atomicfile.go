// Package atomicfile writes a file so that a crash leaves either the old
// file or the whole new one: a temporary file in the same directory,
// synced, renamed over the target, and the directory synced.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Write replaces path with b (mode perm).
func Write(path string, b []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Chmod(perm) // CreateTemp makes 0600
	}
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
