//go:build !race

package tiers

// raceEnabled: the tests run under the race detector.
const raceEnabled = false
