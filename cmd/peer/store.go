package main

import "github.com/spf13/cobra"

// storeCommands returns init, add, get, cat, ls, pin, unpin, gc, scrub, stat.
func storeCommands(a *app) []*cobra.Command { return nil }
