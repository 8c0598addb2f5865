package swarm_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

// A program that embeds the swarm: one call keeps a node in it (signed in,
// topics joined, reconnecting when the session drops); a second node
// fetches a blob the first serves, verified group by group.
func ExampleStart() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A signaling server on loopback (peer signal, or peer daemon
	// --signal-listen, in real use).
	srv := signaling.NewServer(signaling.Config{})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + signaling.Path

	open := func() *cas.Store {
		dir, _ := os.MkdirTemp("", "rdrr-example-")
		st, err := cas.Open(dir, cas.Options{NoSync: true})
		if err != nil {
			panic(err)
		}
		return st
	}
	start := func(st *cas.Store) *swarm.Member {
		id, _ := swarm.NewIdentity()
		m, err := swarm.Start(ctx, swarm.StartOptions{
			Config:    swarm.Config{Identity: id, Source: st, Loopback: true},
			SignalURL: url,
			Topics:    []string{"example"},
		})
		if err != nil {
			panic(err)
		}
		return m
	}
	seedStore, fetchStore := open(), open()
	defer os.RemoveAll(seedStore.Dir())
	defer os.RemoveAll(fetchStore.Dir())
	defer seedStore.Close()
	defer fetchStore.Close()
	info, _ := seedStore.Put(ctx, bytes.NewReader(bytes.Repeat([]byte("rdrr"), 1<<18)))
	seeder := start(seedStore)
	defer seeder.Close()
	fetcher := start(fetchStore)
	defer fetcher.Close()

	got, err := fetcher.Node().Fetch(ctx, fetchStore, info.CID, swarm.FetchOptions{Discover: fetcher.Discover})
	if err != nil {
		panic(err)
	}
	fmt.Println(got.CID == info.CID, got.Size)
	// Output: true 1048576
}
