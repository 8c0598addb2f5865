//go:build linux || darwin

package gpu

import (
	"time"

	"golang.org/x/sys/unix"
)

// preciseSleep blocks the calling thread for about d in a system call
// (nanosleep: tens of microseconds of slack), where a Go timer under a
// millisecond sleeps a whole millisecond in an idle process.
func preciseSleep(d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
