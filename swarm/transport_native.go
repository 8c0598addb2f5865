//go:build !js

package swarm

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"net"
	"time"

	"github.com/pion/ice/v4"
	piontransport "github.com/pion/transport/v4"
	"github.com/pion/transport/v4/stdnet"
	"github.com/pion/webrtc/v4"
)

func newTransport(cfg Config) (*transport, error) {
	bigMTU := cfg.BigMTU
	switch {
	case bigMTU < 0 || !bigMTUSupported():
		bigMTU = 0
	case bigMTU == 0 && cfg.Loopback:
		bigMTU = loopbackBigMTU
	}
	if bigMTU > 0 && (bigMTU <= defaultSCTPMTU || bigMTU > loopbackBigMTU) {
		return nil, fmt.Errorf("swarm: BigMTU %d: want %d..%d", bigMTU, defaultSCTPMTU+1, loopbackBigMTU)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, err := webrtc.GenerateCertificate(key)
	if err != nil {
		return nil, fmt.Errorf("swarm: dtls certificate: %w", err)
	}
	t := &transport{
		conf: webrtc.Configuration{
			ICEServers:   cfg.ICEServers,
			Certificates: []webrtc.Certificate{*cert},
		},
	}
	base := func() (webrtc.SettingEngine, error) {
		var se webrtc.SettingEngine
		se.DetachDataChannels()
		se.SetSCTPMaxMessageSize(maxMessage)
		se.SetSCTPMaxReceiveBufferSize(sctpRecvBuffer)
		// RFC 9653: DTLS already authenticates every SCTP packet, so
		// SCTP's CRC32c is redundant. Each end announces that it accepts
		// zero checksums and sends them only to a peer that announced
		// the same; a peer that does not know the option gets checksums.
		se.EnableSCTPZeroChecksum(true)
		// Each step of a connection's setup is a round trip on a long
		// path (about seven to the HELLOs: swarm/BENCHMARKS.md, "round
		// trips"). Three are cut: SCTP's INIT and COOKIE exchange ride
		// in the SDP (SNAP, pion's sctp-init attribute; used only when
		// both descriptions carry it, so a peer without it gets the usual
		// handshake), and the DTLS server answers the first ClientHello
		// without a HelloVerifyRequest cookie exchange. That cookie
		// guards a server against answering a spoofed source address;
		// DTLS runs only on the candidate pair that ICE checked with the
		// credentials of our signed exchange.
		se.EnableSctpSnap(true)
		se.SetDTLSInsecureSkipHelloVerify(true)
		// A burst of received datagrams larger than the queue between
		// ICE and DTLS (pion: 1 MB) is dropped there, each a fast
		// retransmission and half a congestion window for SCTP: hold a
		// whole SCTP receive window (the patch of
		// swarm/pion-mux-buffer.patch; stock pion keeps 1 MB).
		if q, ok := any(&se).(interface{ SetReceiveBufferSize(int) }); ok {
			q.SetReceiveBufferSize(recvQueue)
		}
		n, err := stdnet.NewNet()
		if err != nil {
			return se, err
		}
		se.SetNet(bufferedNet{Net: n, size: cfg.SocketBuffer, wrap: cfg.testHooks.wrapUDP})
		if cfg.Loopback {
			se.SetIncludeLoopbackCandidate(true)
			se.SetIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
			se.SetRemoteIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
			se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
			se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
			// No path between two processes of one machine drops out
			// and comes back: a silent peer died. pion's defaults (5 s
			// to disconnected, 25 s more to failed) kept a killed
			// peer's connections, its requests in flight and its
			// pieces, for half a minute.
			se.SetICETimeouts(loopbackDisconnected, loopbackFailed, loopbackKeepalive)
		}
		if bigMTU > 0 {
			se.SetReceiveMTU(bigRecvMTU)
		}
		if m := cfg.testHooks.receiveMTU; m > 0 {
			se.SetReceiveMTU(m) // a peer that announces more than it reads
		}
		se.DisableCertificateFingerprintVerification(cfg.testHooks.noPionFingerprintCheck)
		if h := cfg.testHooks.settings; h != nil {
			h(&se)
		}
		return se, nil
	}
	se, err := base()
	if err != nil {
		return nil, err
	}
	t.small = webrtc.NewAPI(webrtc.WithSettingEngine(se))
	if bigMTU > 0 {
		se, err := base()
		if err != nil {
			return nil, err
		}
		any(&se).(mtuSetter).SetSCTPMTU(uint32(bigMTU))
		t.big = webrtc.NewAPI(webrtc.WithSettingEngine(se))
		t.bigMTU = bigMTU
		t.recvMTU = bigRecvMTU
	}
	return t, nil
}

// ICE timeouts on loopback (Config.Loopback): a peer silent for
// loopbackDisconnected + loopbackFailed is dead and its connection
// closes. Keepalives every loopbackKeepalive keep an idle connection
// from looking silent.
const (
	loopbackDisconnected = 3 * time.Second
	loopbackFailed       = 4 * time.Second
	loopbackKeepalive    = time.Second
)

// bufferedNet asks for big UDP socket buffers: at 100 MB/s a default
// 208 KiB receive buffer overflows between two reads, and every drop costs
// an SCTP retransmission and a halved congestion window.
type bufferedNet struct {
	*stdnet.Net
	size int
	wrap func(piontransport.UDPConn) piontransport.UDPConn // testHooks.wrapUDP
}

func (n bufferedNet) ListenUDP(network string, laddr *net.UDPAddr) (piontransport.UDPConn, error) {
	c, err := n.Net.ListenUDP(network, laddr)
	if err != nil {
		return nil, err
	}
	// Best effort: the kernel clamps to its maximum; failure is not fatal.
	_ = c.SetReadBuffer(n.size)
	_ = c.SetWriteBuffer(n.size)
	if n.wrap != nil {
		return n.wrap(c), nil
	}
	return c, nil
}
