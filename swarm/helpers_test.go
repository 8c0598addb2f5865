package swarm

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/signaling/signalingtest"
)

// testLogger logs to the test at warn level (RDRR_TEST_DEBUG=1: debug).
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("RDRR_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startSignal runs a signaling server on 127.0.0.1 for the test. It
// relays between any two peers, so that tests need not join topics.
func startSignal(t testing.TB) string {
	t.Helper()
	return signalingtest.Start(t, signaling.Config{RelayToAnyPeer: true})
}

type testNode struct {
	*Node
	sig *signaling.Client
	st  *cas.Store
}

// newTestNode makes a loopback-only node with its own store, signed in to
// the signaling server at url. mod adjusts the config (Source is the store
// unless mod changes it).
func newTestNode(t testing.TB, url string, mod func(*Config)) *testNode {
	t.Helper()
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	id, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Identity: id, Source: st, Loopback: true, Logger: testLogger(t)}
	if mod != nil {
		mod(&cfg)
	}
	n, err := NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc, err := signaling.Dial(ctx, url, signaling.ClientConfig{Key: id.Key})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		sc.Close()
		st.Close()
	})
	return &testNode{Node: n, sig: sc, st: st}
}

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint64())
	}
	return b
}

func put(t testing.TB, st *cas.Store, data []byte) cas.Info {
	t.Helper()
	inf, err := st.Put(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return inf
}

// addFile stores data as a file (a collection if it is over 64 MiB).
func addFile(t testing.TB, st *cas.Store, data []byte) cas.Info {
	t.Helper()
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	inf, err := st.AddFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(path)
	return inf
}

// readAll returns the whole file c (a blob or a collection) from st.
func readAll(t testing.TB, st *cas.Store, c cas.CID) []byte {
	t.Helper()
	fr, err := st.OpenFile(c)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, fr.Size())
	if _, err := fr.ReadAt(b, 0); err != nil && len(b) > 0 {
		t.Fatalf("read %s: %v", c, err)
	}
	return b
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
