//go:build !linux

package cas

import "errors"

// diskFullChild needs a private tmpfs mount (Linux); TestDiskFullDuringAdd
// is Linux-only.
func diskFullChild(string) error { return errors.New("the disk-full test runs on Linux only") }
