//go:build !race

package experts

// raceEnabled: the tests run under the race detector.
const raceEnabled = false
