package p2p_test

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
	"github.com/rdrr/peer/swarm/p2p"
)

// A program that embeds the swarm with the libp2p overlay: swarm.Start
// with an Overlay keeps one node whose peers, once met, are found on the
// DHT and reached over libp2p, so a fetch works after the signaling
// server is gone.
func ExampleNewOverlay() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv := signaling.NewServer(signaling.Config{})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	url := "ws" + strings.TrimPrefix(hs.URL, "http") + signaling.Path

	start := func() (*swarm.Member, *cas.Store, func()) {
		dir, _ := os.MkdirTemp("", "rdrr-example-")
		st, err := cas.Open(dir, cas.Options{NoSync: true})
		if err != nil {
			panic(err)
		}
		id, _ := swarm.NewIdentity()
		ov, err := p2p.NewOverlay(ctx, p2p.OverlayConfig{Identity: id, Loopback: true})
		if err != nil {
			panic(err)
		}
		m, err := swarm.Start(ctx, swarm.StartOptions{
			Config:    swarm.Config{Identity: id, Source: st, Loopback: true},
			SignalURL: url,
			Topics:    []string{"example"},
			Overlay:   ov,
			Announce: func(context.Context) ([]cas.CID, error) {
				var out []cas.CID
				err := st.List(func(i cas.Info) error { out = append(out, i.CID); return nil })
				return out, err
			},
			AnnounceEvery: 100 * time.Millisecond,
		})
		if err != nil {
			panic(err)
		}
		return m, st, func() { m.Close(); ov.Close(); st.Close(); os.RemoveAll(dir) }
	}
	seeder, seedStore, stopSeeder := start()
	defer stopSeeder()
	info, _ := seedStore.Put(ctx, bytes.NewReader(bytes.Repeat([]byte("rdrr"), 1<<18)))
	fetcher, fetchStore, stopFetcher := start()
	defer stopFetcher()
	for seeder.Announced() == 0 && ctx.Err() == nil { // met, and the blob is on the DHT
		time.Sleep(20 * time.Millisecond)
	}

	srv.Close() // the signaling server goes away
	got, err := fetcher.Node().Fetch(ctx, fetchStore, info.CID, swarm.FetchOptions{Discover: fetcher.Discover, Providers: fetcher.Providers})
	if err != nil {
		panic(err)
	}
	fmt.Println(got.CID == info.CID, got.Size)
	// Output: true 1048576
}
