//go:build !linux && !js

package cas

import "os"

// startWriteback is a no-op where sync_file_range(2) does not exist: the
// final fsync then does all the writing back. Only speed differs.
func startWriteback(f *os.File, off, n int64) {}
