//go:build !linux

package gpu

// pinPollThread does nothing where the timer slack cannot be set.
func pinPollThread() {}
