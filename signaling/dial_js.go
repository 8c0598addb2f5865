//go:build js

package signaling

import "github.com/coder/websocket"

// dialOptions: in a browser the page's WebSocket dials; cfg.HTTPClient
// does not apply.
func dialOptions(cfg ClientConfig) *websocket.DialOptions { return nil }
