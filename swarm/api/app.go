package api

import (
	"net/http"

	"github.com/rdrr/peer/swarm/browser/static"
)

// AppConfig is what the browser peer at /app/ starts with
// (/app/config.json); the page's URL parameters override it.
type AppConfig struct {
	// Signal is the signaling server's URL as a browser on this
	// machine reaches it (ws://host:port/v1).
	Signal string   `json:"signal"`
	Topics []string `json:"topics"`
	// Loopback: the page keeps to loopback candidates, as the daemon does.
	Loopback bool `json:"loopback"`
}

// app serves the browser peer (swarm/browser/static) under /app/.
func (s *Server) app() http.Handler {
	files := http.StripPrefix("/app/", http.FileServerFS(static.Files()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		switch {
		case r.URL.Path == "/app/config.json":
			cfg := &AppConfig{Topics: []string{"rdrr"}}
			if s.App != nil {
				if c := s.App(); c != nil {
					cfg = c
				}
			}
			writeJSON(w, cfg)
		case r.URL.Path == "/app/" && !static.Built():
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte("this peer was built without the browser peer: build it with `make build` (scripts/build-wasm.sh)\n"))
		default:
			files.ServeHTTP(w, r)
		}
	})
}
