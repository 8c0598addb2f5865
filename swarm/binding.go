package swarm

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// description is the data of an offer or answer signaling message: the SDP,
// what the sender asks of the connection, and the sender's signature that
// binds the SDP's DTLS fingerprints to its peer ID (PROTOCOL.md, "Binding
// the DTLS certificate to the peer ID").
type description struct {
	SDP  string   `json:"sdp"`
	Caps linkCaps `json:"caps"`
	Sig  []byte   `json:"sig"`
	// P2P are the sender's libp2p addresses (PROTOCOL.md 2.1): hints,
	// not signed, since libp2p's own handshake proves the peer ID of
	// whoever answers at them.
	P2P []string `json:"p2p,omitempty"`
}

// Bounds on the libp2p addresses a description may carry; beyond them
// the addresses are ignored (the description is still used).
const (
	maxP2PAddrs   = 8
	maxP2PAddrLen = 256
)

// p2pAddrs returns d's addresses if they are within the bounds, else none.
func (d *description) p2pAddrs() []string {
	if len(d.P2P) > maxP2PAddrs {
		return nil
	}
	for _, a := range d.P2P {
		if a == "" || len(a) > maxP2PAddrLen {
			return nil
		}
	}
	return d.P2P
}

// linkCaps are the signed connection parameters.
type linkCaps struct {
	// Bulk is how many bulk channels the offerer opens (offer only).
	Bulk int `json:"bulk,omitempty"`
	// RecvMTU is the largest UDP datagram the sender reads (its receive
	// buffer); 0 means unknown. The other end sends SCTP packets of at
	// most RecvMTU - dtlsOverhead bytes, and pion's default (1191) if
	// that is 0 or less (PROTOCOL.md 2.1).
	RecvMTU int `json:"recv_mtu,omitempty"`
}

const bindingDomain = "rdrr-webrtc/1 dtls binding\n"

// bindingPayload is the exact byte string signed by the sender of an offer
// or answer. Fingerprints are normalized to lower case and sorted.
func bindingPayload(kind, sid string, from, to peer.ID, fingerprints []string, caps linkCaps) []byte {
	fps := make([]string, len(fingerprints))
	for i, f := range fingerprints {
		fps[i] = strings.ToLower(f)
	}
	slices.Sort(fps)
	var b strings.Builder
	b.WriteString(bindingDomain)
	b.WriteString("kind=" + kind + "\n")
	b.WriteString("sid=" + sid + "\n")
	b.WriteString("from=" + from.String() + "\n")
	b.WriteString("to=" + to.String() + "\n")
	b.WriteString("fingerprints=" + strings.Join(fps, ",") + "\n")
	b.WriteString("bulk=" + strconv.Itoa(caps.Bulk) + "\n")
	b.WriteString("recv_mtu=" + strconv.Itoa(caps.RecvMTU) + "\n")
	return []byte(b.String())
}

// sdpFingerprints returns the values of every a=fingerprint line of sdp
// ("sha-256 AB:CD:..."), session or media level.
func sdpFingerprints(sdp string) []string {
	var out []string
	for line := range strings.Lines(sdp) {
		line = strings.TrimRight(line, "\r\n")
		if v, ok := strings.CutPrefix(line, "a=fingerprint:"); ok {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// signDescription makes the data of an offer or answer.
func signDescription(key crypto.PrivKey, kind, sid string, from, to peer.ID, sdp string, caps linkCaps) (json.RawMessage, error) {
	return signDescriptionAddrs(key, kind, sid, from, to, sdp, caps, nil)
}

// signDescriptionAddrs is signDescription with the sender's libp2p
// addresses (unsigned hints).
func signDescriptionAddrs(key crypto.PrivKey, kind, sid string, from, to peer.ID, sdp string, caps linkCaps, addrs []string) (json.RawMessage, error) {
	fps := sdpFingerprints(sdp)
	if len(fps) == 0 {
		return nil, fmt.Errorf("swarm: %s has no DTLS fingerprint", kind)
	}
	sig, err := key.Sign(bindingPayload(kind, sid, from, to, fps, caps))
	if err != nil {
		return nil, err
	}
	if len(addrs) > maxP2PAddrs {
		addrs = addrs[:maxP2PAddrs]
	}
	return json.Marshal(description{SDP: sdp, Caps: caps, Sig: sig, P2P: addrs})
}

// verifyDescription parses the data of an offer or answer from `from` and
// checks that from's key signed its fingerprints for this session. It
// returns the description and the signed fingerprints (normalized).
func verifyDescription(data []byte, kind, sid string, from, to peer.ID) (*description, []string, error) {
	var d description
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, nil, &IdentityError{Peer: from, Reason: kind + " is not a description: " + err.Error()}
	}
	fps := sdpFingerprints(d.SDP)
	if len(fps) == 0 {
		return nil, nil, &IdentityError{Peer: from, Reason: kind + " carries no DTLS fingerprint"}
	}
	pub, err := from.ExtractPublicKey()
	if err != nil {
		return nil, nil, &IdentityError{Peer: from, Reason: "peer id does not embed a public key"}
	}
	ok, err := pub.Verify(bindingPayload(kind, sid, from, to, fps, d.Caps), d.Sig)
	if err != nil || !ok {
		return nil, nil, &IdentityError{Peer: from, Reason: kind + " signature does not bind its DTLS fingerprint to the peer id"}
	}
	for i := range fps {
		fps[i] = strings.ToLower(fps[i])
	}
	return &d, fps, nil
}

// certFingerprint is the "sha-256 ab:cd:..." fingerprint of a DER
// certificate, as SDP writes it (lower case).
func certFingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	h := hex.EncodeToString(sum[:])
	var b strings.Builder
	b.WriteString("sha-256 ")
	for i := 0; i < len(h); i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(h[i : i+2])
	}
	return b.String()
}
