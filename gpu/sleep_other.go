//go:build !linux && !darwin

package gpu

import "time"

// preciseSleep sleeps for about d (a Go timer: on some systems at least
// a millisecond).
func preciseSleep(d time.Duration) { time.Sleep(d) }
