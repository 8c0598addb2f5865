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
	"github.com/rdrr/peer/swarm/wire"
)

const (
	// defaultSCTPMTU is pion's outbound SCTP packet size (libwebrtc's
	// kMaxSafeMTUSize), used unless both ends agree on more.
	defaultSCTPMTU = 1191
	// loopbackBigMTU is the SCTP packet size used on loopback when both
	// ends accept it. pion/sctp reads packets into 8 KiB buffers.
	loopbackBigMTU = 8000
	// bigRecvMTU is the UDP datagram size we can receive when big packets
	// are on (pion's receive buffer, SettingEngine.SetReceiveMTU), and
	// what we announce as caps.recv_mtu. Stock pion reads 1500 bytes.
	bigRecvMTU = 16384
	// dtlsOverhead bounds what DTLS 1.2 adds to an SCTP packet: record
	// header 13, explicit IV or nonce up to 16, MAC or tag up to 20, CBC
	// padding up to 15. A peer that announces recv_mtu gets SCTP packets
	// of at most recv_mtu - dtlsOverhead bytes.
	dtlsOverhead = 64
	// bigMTUProbe is how long a link that sends big packets may have
	// bytes outstanding without any being acknowledged before the node
	// decides they do not get through (bigMTUProven bytes acknowledged
	// show that they do).
	bigMTUProbe  = 10 * time.Second
	bigMTUProven = 256 << 10
	// maxMessage is the max-message-size we announce in SDP: 256 KiB, as
	// Chromium does. Our frames are at most 64 KiB; a larger message is
	// read far enough to be refused with a reason (wire.CodeFrameTooLarge).
	maxMessage = 256 << 10
	// sctpRecvBuffer is the SCTP receive window per association.
	sctpRecvBuffer = 4 << 20
)

// transport holds the pion APIs a node makes peer connections with: one for
// pion's default packet size, and one for big packets where both ends and
// the path allow them.
type transport struct {
	small   *webrtc.API
	big     *webrtc.API // nil when big packets are off
	bigMTU  int
	recvMTU int // what we announce we can receive (0: default)
	conf    webrtc.Configuration
}

// mtuSetter is what a pion build that can set the outbound SCTP packet size
// offers (upstream v4.2.20 hard-codes 1191; see NOTES-for-lead.md).
type mtuSetter interface{ SetSCTPMTU(mtu uint32) }

// bigMTUSupported reports whether this build's pion can send big packets.
func bigMTUSupported() bool {
	_, ok := any(&webrtc.SettingEngine{}).(mtuSetter)
	return ok
}

func newTransport(cfg Config) (*transport, error) {
	bigMTU := cfg.BigMTU
	switch {
	case bigMTU < 0 || !bigMTUSupported():
		bigMTU = 0
	case bigMTU == 0 && cfg.Loopback:
		bigMTU = loopbackBigMTU
	}
	if bigMTU > 0 && (bigMTU <= defaultSCTPMTU || bigMTU > 8192) {
		return nil, fmt.Errorf("swarm: BigMTU %d: want %d..8192", bigMTU, defaultSCTPMTU+1)
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
		n, err := stdnet.NewNet()
		if err != nil {
			return se, err
		}
		se.SetNet(bufferedNet{Net: n, size: cfg.SocketBuffer})
		if cfg.Loopback {
			se.SetIncludeLoopbackCandidate(true)
			se.SetIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
			se.SetRemoteIPFilter(func(ip net.IP) bool { return ip.IsLoopback() })
			se.SetNetworkTypes([]webrtc.NetworkType{webrtc.NetworkTypeUDP4})
			se.SetICEMulticastDNSMode(ice.MulticastDNSModeDisabled)
		}
		if bigMTU > 0 {
			se.SetReceiveMTU(bigRecvMTU)
		}
		if m := cfg.testHooks.receiveMTU; m > 0 {
			se.SetReceiveMTU(m) // a peer that announces more than it reads
		}
		se.DisableCertificateFingerprintVerification(cfg.testHooks.noPionFingerprintCheck)
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

// api returns the API for a connection to a peer that reads UDP datagrams
// of up to peerRecvMTU bytes (caps.recv_mtu; 0: unknown, pion's default).
func (t *transport) api(peerRecvMTU int) *webrtc.API {
	if t.big != nil && peerRecvMTU >= t.bigMTU+dtlsOverhead {
		return t.big
	}
	return t.small
}

// watchBigMTU runs on a link that sends big SCTP packets until they are
// seen to arrive (bigMTUProven bytes acknowledged). If bytes stay
// outstanding for bigMTUProbe and none is acknowledged, big packets do not
// get through (the path drops them, or the peer reads smaller datagrams
// than it announced): the node sends this peer default-size packets from
// now on (Node.bigMTUFailed) and closes the link, so that the peer
// reconnects, instead of letting every request stall.
func (l *link) watchBigMTU() {
	defer l.wg.Done()
	probe := bigMTUProbe
	if p := l.n.cfg.testHooks.bigMTUProbe; p > 0 {
		probe = p
	}
	tick := time.NewTicker(probe / 20)
	defer tick.Stop()
	var last int64
	since := time.Now()
	for {
		select {
		case <-l.done:
			return
		case <-tick.C:
		}
		acked, queued := l.delivery()
		switch {
		case acked >= bigMTUProven:
			return
		case acked > last || queued == 0:
			last, since = acked, time.Now()
		case time.Since(since) >= probe:
			reason := fmt.Sprintf("no byte of %d acknowledged in %v with %d-byte SCTP packets; reconnect: you get %d-byte packets", queued, probe, l.n.tr.bigMTU, defaultSCTPMTU)
			l.n.bigMTUFailed(l.remote)
			l.n.record(Event{Peer: l.remote, Kind: EventNoBigMTU, Detail: reason})
			l.shutdown(wire.CodeTimeout, reason, fmt.Errorf("%w: %s", ErrLinkClosed, reason))
			return
		}
	}
}

// delivery returns the bytes written on the link's channels that the peer
// acknowledged, and those still queued.
func (l *link) delivery() (acked, queued int64) {
	l.mu.Lock()
	chs := append([]*channel{l.ctl}, l.bulk...)
	l.mu.Unlock()
	for _, ch := range chs {
		if ch == nil {
			continue
		}
		q := int64(ch.dc.BufferedAmount())
		acked += max(0, ch.written.Load()-q)
		queued += q
	}
	return acked, queued
}

// bufferedNet asks for big UDP socket buffers: at 100 MB/s a default
// 208 KiB receive buffer overflows between two reads, and every drop costs
// an SCTP retransmission and a halved congestion window.
type bufferedNet struct {
	*stdnet.Net
	size int
}

func (n bufferedNet) ListenUDP(network string, laddr *net.UDPAddr) (piontransport.UDPConn, error) {
	c, err := n.Net.ListenUDP(network, laddr)
	if err != nil {
		return nil, err
	}
	// Best effort: the kernel clamps to its maximum; failure is not fatal.
	_ = c.SetReadBuffer(n.size)
	_ = c.SetWriteBuffer(n.size)
	return c, nil
}
