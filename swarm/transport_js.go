//go:build js

package swarm

import (
	"net"
	"strings"

	"github.com/pion/webrtc/v4"
)

// newTransport in a browser: pion wraps the page's RTCPeerConnection,
// which makes its own DTLS certificate, gathers its own candidates and
// sends 1191-byte SCTP packets (PROTOCOL.md section 8). What the native
// SettingEngine does for Config.Loopback is done on the candidates.
func newTransport(cfg Config) (*transport, error) {
	var se webrtc.SettingEngine
	se.DetachDataChannels()
	t := &transport{
		small: webrtc.NewAPI(webrtc.WithSettingEngine(se)),
		conf:  webrtc.Configuration{ICEServers: cfg.ICEServers},
	}
	if cfg.Loopback {
		t.keep = loopbackCandidate
	}
	return t, nil
}

// loopbackCandidate reports whether an ICE candidate line
// ("candidate:1 1 udp 2122260223 127.0.0.1 51234 typ host ...") is a UDP
// candidate on a loopback address. Browsers gather on every interface;
// a loopback-only node offers and accepts 127.0.0.1 only.
func loopbackCandidate(c string) bool {
	f := strings.Fields(strings.TrimPrefix(c, "a="))
	if len(f) < 8 || !strings.EqualFold(f[2], "udp") {
		return false
	}
	ip := net.ParseIP(f[4])
	return ip != nil && ip.IsLoopback() && ip.To4() != nil
}
