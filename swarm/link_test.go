package swarm

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// Every way the DTLS certificate can fail to belong to the claimed peer ID
// ends the connection before a single frame is read.
func TestIdentityMismatchRejected(t *testing.T) {
	other, err := NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	otherFP := func(sdp string) string {
		// Swap the fingerprint for one of another certificate.
		fps := sdpFingerprints(sdp)
		return strings.Replace(sdp, fps[0], "sha-256 "+strings.Repeat("AB:", 31)+"AB", 1)
	}
	cases := []struct {
		name  string
		hooks testHooks
		who   string // which side plays dishonest: "dialer" or "answerer"
	}{
		{"offer signed by another key", testHooks{signingKey: other.Key}, "dialer"},
		{"answer signed by another key", testHooks{signingKey: other.Key}, "answerer"},
		{"offer fingerprint changed in transit", testHooks{tamper: tamperFingerprint}, "dialer"},
		{"answer fingerprint changed in transit", testHooks{tamper: tamperFingerprint}, "answerer"},
		{"signed fingerprint is not the certificate's", testHooks{mangleSDP: func(_, sdp string) string { return otherFP(sdp) }}, "answerer"},
		{"certificate check without pion's", testHooks{mangleSDP: func(_, sdp string) string { return otherFP(sdp) }, noPionFingerprintCheck: true}, "answerer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := startSignal(t)
			bad := func(c *Config) { c.testHooks = tc.hooks; c.ConnectTimeout = 5 * time.Second }
			// The honest side skips pion's check too where the case says.
			good := func(c *Config) { c.testHooks.noPionFingerprintCheck = tc.hooks.noPionFingerprintCheck }
			var dialer, answerer *testNode
			if tc.who == "dialer" {
				dialer, answerer = newTestNode(t, url, bad), newTestNode(t, url, good)
			} else {
				dialer, answerer = newTestNode(t, url, good), newTestNode(t, url, bad)
			}
			err := dialer.Connect(ctxFor(t, 20*time.Second), answerer.ID())
			if err == nil {
				t.Fatal("connection with a mismatched identity succeeded")
			}
			if dialer.Links(answerer.ID()) != 0 || answerer.Links(dialer.ID()) != 0 {
				t.Fatal("a link was registered")
			}
			// The honest side recorded who it was.
			honest, liar := answerer, dialer
			if tc.who == "answerer" {
				honest, liar = dialer, answerer
			}
			if tc.name == "signed fingerprint is not the certificate's" {
				// pion's own DTLS check may fail the handshake before ours
				// runs; either way no frame moved (no link above).
				return
			}
			found := false
			for _, e := range honest.Events() {
				found = found || e.Kind == EventIdentity && e.Peer == liar.ID()
			}
			if !found {
				t.Fatalf("no identity event for %s: %+v", liar.ID(), honest.Events())
			}
		})
	}
}

// tamperFingerprint changes one hex digit of the signed SDP's fingerprint,
// as a relay in the middle would, keeping the signature.
func tamperFingerprint(kind string, d json.RawMessage) json.RawMessage {
	var desc description
	json.Unmarshal(d, &desc)
	fp := sdpFingerprints(desc.SDP)[0]
	mod := fp[:len(fp)-1] + map[bool]string{true: "0", false: "1"}[fp[len(fp)-1] != '0']
	desc.SDP = strings.Replace(desc.SDP, fp, mod, 1)
	out, _ := json.Marshal(desc)
	return out
}

func TestBindingPayloadIsStable(t *testing.T) {
	// The exact bytes are part of the protocol (a browser signs them too).
	a, _ := NewIdentity()
	b, _ := NewIdentity()
	got := string(bindingPayload("offer", "s1", a.ID, b.ID, []string{"SHA-256 AB:CD", "sha-256 01:02"}, linkCaps{Bulk: 2, RecvMTU: 16384}))
	want := "rdrr-webrtc/1 dtls binding\nkind=offer\nsid=s1\nfrom=" + a.ID.String() + "\nto=" + b.ID.String() +
		"\nfingerprints=sha-256 01:02,sha-256 ab:cd\nbulk=2\nrecv_mtu=16384\n"
	if got != want {
		t.Fatalf("payload\n%q\nwant\n%q", got, want)
	}
	data, err := signDescription(a.Key, "offer", "s1", a.ID, b.ID, "v=0\r\na=fingerprint:sha-256 AB:CD\r\n", linkCaps{Bulk: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, fps, err := verifyDescription(data, "offer", "s1", a.ID, b.ID); err != nil || len(fps) != 1 || fps[0] != "sha-256 ab:cd" {
		t.Fatalf("verify = %v, %v", fps, err)
	}
	for _, wrong := range []struct{ kind, sid string }{{"answer", "s1"}, {"offer", "s2"}} {
		if _, _, err := verifyDescription(data, wrong.kind, wrong.sid, a.ID, b.ID); !errors.Is(err, ErrIdentity) {
			t.Fatalf("verify as %v: %v; want ErrIdentity", wrong, err)
		}
	}
	if _, _, err := verifyDescription(data, "offer", "s1", b.ID, a.ID); !errors.Is(err, ErrIdentity) {
		t.Fatalf("verify with swapped ids: %v", err)
	}
	_ = crypto.Ed25519
}

// connected returns two nodes with open links, and b's first link to a.
func connected(t *testing.T) (a, b *testNode, l *link) {
	t.Helper()
	url := startSignal(t)
	a = newTestNode(t, url, nil)
	b = newTestNode(t, url, func(c *Config) { c.Links = 1 })
	if err := b.Connect(ctxFor(t, 20*time.Second), a.ID()); err != nil {
		t.Fatal(err)
	}
	return a, b, b.linksTo(a.ID())[0]
}

// Frames that are too large or do not decode close the connection, and
// the peer that sent them is told why.
func TestBadFramesCloseWithReason(t *testing.T) {
	cases := []struct {
		name   string
		bulk   bool
		frame  []byte
		code   wire.Code
		reason string
	}{
		{"unknown type", false, []byte{0, 0, 0, 1, 99}, wire.CodeMalformed, "unknown frame type"},
		{"bad length prefix", false, []byte{0, 0, 0, 9, 6, 0, 0, 0, 1}, wire.CodeMalformed, "length prefix"},
		{"oversize on control", false, make([]byte, 100<<10), wire.CodeFrameTooLarge, "larger than 65536"},
		{"oversize on bulk", true, make([]byte, wire.MaxFrame+1), wire.CodeFrameTooLarge, "larger than 65536"},
		{"request on bulk", true, wire.AppendRequest(nil, 1, cas.CID{}, 0, 16384), wire.CodeProtocol, "on a bulk channel"},
		{"piece never requested", true, wire.AppendPiece(nil, 777, 0, []byte{1}), wire.CodeProtocol, "never made"},
		{"second hello", false, wire.AppendHello(nil, wire.Hello{Version: 1, MaxFrame: wire.MaxFrame, MaxRequest: 1 << 20, MaxOutstanding: 1}), wire.CodeProtocol, "second HELLO"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b, l := connected(t)
			ch := l.ctl
			if tc.bulk {
				ch = l.bulk[0]
			}
			if err := ch.write(ctxFor(t, 5*time.Second), tc.frame); err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.done:
			case <-time.After(10 * time.Second):
				t.Fatal("link not closed")
			}
			var rej *RejectError
			if err := l.errClosed(); !errors.As(err, &rej) || rej.Req != 0 || rej.Code != tc.code || !strings.Contains(rej.Reason, tc.reason) {
				t.Fatalf("link closed with %v; want REJECT %v %q", err, tc.code, tc.reason)
			}
			found := false
			for _, e := range a.Events() {
				found = found || e.Kind == EventProtocol && e.Peer == b.ID() && strings.Contains(e.Detail, tc.reason)
			}
			if !found {
				t.Fatalf("a recorded no protocol event for b: %+v", a.Events())
			}
		})
	}
}

func TestNodeCloseTellsPeers(t *testing.T) {
	a, _, l := connected(t)
	a.Close()
	select {
	case <-l.done:
	case <-time.After(10 * time.Second):
		t.Fatal("link not closed")
	}
	var rej *RejectError
	if err := l.errClosed(); !errors.As(err, &rej) || rej.Code != wire.CodeGoingAway {
		t.Fatalf("link closed with %v; want going_away", err)
	}
}
