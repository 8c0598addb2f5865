package main

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
)

// envCPUProfile names a file to write a Go CPU profile of the whole
// process to, from start to exit; "%p" in it becomes the process ID, so
// that the processes of one benchmark (a daemon and nine gets) each write
// their own. For profiling the swarm's transport: the benchmarks run the
// peer binary as several processes, where flags are awkward to thread.
const envCPUProfile = "RDRR_CPUPROFILE"

// startCPUProfile starts the profile RDRR_CPUPROFILE asks for and returns
// the function that ends it (a no-op when none was asked for).
func startCPUProfile() (stop func()) {
	path := os.Getenv(envCPUProfile)
	if path == "" {
		return func() {}
	}
	stop, err := profileCPU(strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid())))
	if err != nil {
		fmt.Fprintf(os.Stderr, "peer: %s: %v\n", envCPUProfile, err)
		return func() {}
	}
	return stop
}

// profileCPU starts a Go CPU profile into the file at path and returns
// the function that stops it and closes the file.
func profileCPU(path string) (stop func(), err error) {
	return profileTo(path, pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// traceGo starts a Go execution trace into the file at path and returns
// the function that stops it and closes the file.
func traceGo(path string) (stop func(), err error) {
	return profileTo(path, trace.Start, trace.Stop)
}

// profileTo creates the file at path, starts writing a profile into it
// and returns the function that ends the profile and closes the file.
func profileTo(path string, start func(io.Writer) error, end func()) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		end()
		f.Close()
	}, nil
}
