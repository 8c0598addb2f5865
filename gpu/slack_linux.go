//go:build linux

package gpu

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// pollThreadSlack is the timer slack of the poller's thread: how late the
// kernel may end its nanosleeps. Linux's default, 50 us, is more than the
// 20 us the poller sleeps while a read-back is awaited, and a paged decode
// step awaits 33 of them.
const pollThreadSlack = 1000 // ns

// pinPollThread puts the calling goroutine (the poller) on an OS thread of
// its own whose timer slack is pollThreadSlack. The goroutine never
// unlocks: when it returns, the runtime ends the thread, so the slack is
// never inherited by other goroutines.
func pinPollThread() {
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, pollThreadSlack, 0, 0, 0)
}
