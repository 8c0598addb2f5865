package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/rdrr/peer/swarm/browser/static"
)

// /app/ serves the browser peer's page and its configuration; a binary
// built without the WebAssembly says so.
func TestApp(t *testing.T) {
	want := &AppConfig{Signal: "ws://127.0.0.1:7777/v1", Topics: []string{"rdrr", "m"}, Loopback: true}
	s := &Server{Token: "t", App: func() *AppConfig { return want }}
	h := s.Handler()
	defer s.Close()
	get := func(path string) (int, string, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		b, _ := io.ReadAll(rec.Body)
		return rec.Code, rec.Header().Get("Content-Type"), string(b)
	}
	code, _, body := get("/app/config.json")
	var got AppConfig
	if code != 200 || json.Unmarshal([]byte(body), &got) != nil || !reflect.DeepEqual(&got, want) {
		t.Errorf("config.json: %d %s; want %+v", code, body, want)
	}
	if code, _, body := get("/app/app.js"); code != 200 || !strings.Contains(body, "rdrrShell") {
		t.Errorf("app.js: %d", code)
	}
	code, _, body = get("/app/")
	switch {
	case static.Built() && (code != 200 || !strings.Contains(body, "rdrr browser peer")):
		t.Errorf("/app/ with the peer built: %d %q", code, body)
	case !static.Built() && (code != 404 || !strings.Contains(body, "make build")):
		t.Errorf("/app/ without the peer built: %d %q", code, body)
	}
	if static.Built() {
		if code, ctype, _ := get("/app/peer.wasm"); code != 200 || ctype != "application/wasm" {
			t.Errorf("peer.wasm: %d %s; want 200 application/wasm (instantiateStreaming needs it)", code, ctype)
		}
	}
}
