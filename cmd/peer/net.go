package main

import "github.com/spf13/cobra"

// netCommands returns the network commands: signal, serve (owned by the
// signaling/swarm work).
func netCommands(a *app) []*cobra.Command { return nil }
