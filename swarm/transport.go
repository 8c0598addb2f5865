package swarm

import (
	"fmt"
	"time"

	"github.com/pion/webrtc/v4"
	"github.com/rdrr/peer/swarm/wire"
)

const (
	// defaultSCTPMTU is pion's outbound SCTP packet size (libwebrtc's
	// kMaxSafeMTUSize), used unless both ends agree on more.
	defaultSCTPMTU = 1191
	// loopbackBigMTU is the SCTP packet size used on loopback when both
	// ends accept it, and the largest BigMTU: a DTLS record carries at
	// most 2^14 bytes. Per-packet costs (a sendto, SCTP's and DTLS's
	// bookkeeping) dominate the CPU a byte costs on loopback: 16 KiB
	// packets took a third less CPU than 8000-byte ones
	// (swarm/BENCHMARKS.md).
	loopbackBigMTU = 1 << 14
	// bigRecvMTU is the UDP datagram size we can receive when big packets
	// are on (pion's receive buffer, SettingEngine.SetReceiveMTU), and
	// what we announce as caps.recv_mtu: a record of loopbackBigMTU
	// bytes. Stock pion reads 1500 bytes (and its ICE, DTLS and SCTP
	// layers 8 KiB at most: the patches of scripts/patched-deps.sh lift
	// that). Reference peers before it announced 16384 and read 8192:
	// announcing more than 16384 tells a peer that we read 16 KiB
	// packets, and keeps it from sending them to those older peers.
	bigRecvMTU = loopbackBigMTU + dtlsOverhead
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
	// recvQueue bounds the received datagrams queued between ICE and
	// DTLS (pion's mux; SettingEngine.SetReceiveBufferSize): a whole SCTP
	// receive window in packets of any size we use, with their SCTP and
	// DTLS headers (under a tenth more for 1191-byte packets), so that a
	// peer within our window never overflows it. It grows as it is used.
	recvQueue = sctpRecvBuffer + sctpRecvBuffer/4
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
	// keep filters ICE candidates, local and remote, where the
	// SettingEngine cannot (in a browser); nil keeps every one.
	keep func(candidate string) bool
}

// mtuSetter is what a pion build that can set the outbound SCTP packet size
// offers (upstream v4.2.20 hard-codes 1191; see NOTES-for-lead.md).
type mtuSetter interface{ SetSCTPMTU(mtu uint32) }

// bigMTUSupported reports whether this build's pion can send big packets.
func bigMTUSupported() bool {
	_, ok := any(&webrtc.SettingEngine{}).(mtuSetter)
	return ok
}

// api returns the API for a connection to a peer that reads UDP datagrams
// of up to peerRecvMTU bytes (caps.recv_mtu; 0: unknown, pion's default).
func (t *transport) api(peerRecvMTU int) *webrtc.API {
	if t.readsBig(peerRecvMTU) {
		return t.big
	}
	return t.small
}

// readsBig reports whether we send big packets to a peer that reads UDP
// datagrams of up to peerRecvMTU bytes.
func (t *transport) readsBig(peerRecvMTU int) bool {
	return t.big != nil && peerRecvMTU >= t.bigMTU+dtlsOverhead
}

// sctpMTUSetter is what a pion build offers that can set one connection's
// outbound SCTP packet size after the connection was made (the patch that
// gives mtuSetter; see scripts/patched-deps.sh).
type sctpMTUSetter interface{ SetMTU(mtu uint32) }

// offeredBig makes pc, a connection we offered (made with t.small: the
// offer goes out before we know what the peer reads), send big packets
// to a peer whose answer announced peerRecvMTU, if that peer reads them.
// It must be called before the answer is applied (the SCTP association
// starts after DTLS connects, which needs the answer), and reports
// whether pc now sends big packets. Without it an offerer sent 1191-byte
// packets to every peer it dialed: in a swarm, half of the traffic
// between leechers (swarm/BENCHMARKS.md, 2026-11-27 midday).
func (t *transport) offeredBig(pc *webrtc.PeerConnection, peerRecvMTU int) bool {
	if !t.readsBig(peerRecvMTU) {
		return false
	}
	s, ok := any(pc.SCTP()).(sctpMTUSetter)
	if !ok {
		return false
	}
	s.SetMTU(uint32(t.bigMTU))
	return true
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
