// Package signalingtest runs signaling servers for tests, as httptest does
// for HTTP servers.
package signalingtest

import (
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/rdrr/peer/signaling"
)

// Start runs a signaling server with cfg on 127.0.0.1 until the test ends
// and returns its WebSocket URL. cfg is used as given: the server relays
// only between peers that share a topic unless cfg.RelayToAnyPeer is set,
// and all test clients come from one address, so a test with more than
// 64 clients (the default MaxConnsPerAddr) sets MaxConnsPerAddr.
func Start(t testing.TB, cfg signaling.Config) string {
	t.Helper()
	if cfg.Logger == nil && os.Getenv("RDRR_TEST_DEBUG") != "" {
		// The server's view, to stderr, when a test is debugged.
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	s := signaling.NewServer(cfg)
	hs := httptest.NewServer(s)
	t.Cleanup(func() {
		s.Close()
		hs.Close()
	})
	return "ws" + strings.TrimPrefix(hs.URL, "http") + signaling.Path
}
