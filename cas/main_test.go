package cas

import (
	"fmt"
	"os"
	"testing"
)

// Child roles of the test binary: the test re-runs itself with one of
// these set to the store's directory.
const (
	// crashChildEnv: add blobs and download partials until killed
	// (TestCrashKill).
	crashChildEnv = "RDRR_CAS_CRASH_CHILD"
	// diskFullChildEnv: add to a store on a tiny tmpfs
	// (TestDiskFullDuringAdd).
	diskFullChildEnv = "RDRR_CAS_DISKFULL_CHILD"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	if dir := os.Getenv(diskFullChildEnv); dir != "" {
		if err := diskFullChild(dir); err != nil {
			fmt.Println("FAIL:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}
