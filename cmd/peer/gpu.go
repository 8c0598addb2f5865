package main

import "github.com/spf13/cobra"

// gpuCommands returns the `peer gpu ...` commands (owned by the gpu work).
func gpuCommands(a *app) []*cobra.Command { return nil }
