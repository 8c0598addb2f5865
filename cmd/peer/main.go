// Command peer is the rdrr peer: a content-addressed store of model shards
// and kernels, a swarm member, and a paged MoE inference engine.
//
// The command is thin: it parses flags and configuration, calls the package
// that does the work and prints the result. See DESIGN.md.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stopProfile := startCPUProfile()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	stopProfile()
	if err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(1)
	}
}

// exitError carries a specific exit status (scrub uses 3 for "bad blobs
// found") after the command has already printed its report.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }
