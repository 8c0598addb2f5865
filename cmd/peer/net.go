package main

import (
	"context"
	"errors"

	"github.com/rdrr/peer/cas"
	"github.com/spf13/cobra"
)

// netCommands returns the network commands: signal, serve (owned by the
// signaling/swarm work).
func netCommands(a *app) []*cobra.Command { return nil }

// fetchFromSwarm makes blob c (and, for a collection, its shards) present
// in st by fetching it from the peers of topic found through the signaling
// server at signalURL.
func fetchFromSwarm(ctx context.Context, a *app, st *cas.Store, c cas.CID, signalURL, topic string) error {
	return errors.New("fetching from the swarm is not built yet")
}
