//go:build !js

package signaling

import "github.com/coder/websocket"

func dialOptions(cfg ClientConfig) *websocket.DialOptions {
	return &websocket.DialOptions{HTTPClient: cfg.HTTPClient}
}
