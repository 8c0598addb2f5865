//go:build !linux

package cas

import "errors"

// dropCache is Linux-only (posix_fadvise); elsewhere cold reads are not
// measured.
func dropCache(string) error { return errors.New("no posix_fadvise here") }
