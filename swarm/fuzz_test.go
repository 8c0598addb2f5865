package swarm

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm/wire"
)

// FuzzVerifyBinding: no offer or answer data panics the verifier, and
// whatever it accepts is signed by the sender's key over exactly the
// fingerprints of the SDP it returns (so a relay cannot slip in a
// certificate).
func FuzzVerifyBinding(f *testing.F) {
	from, to := make([]byte, ed25519.SeedSize), make([]byte, ed25519.SeedSize)
	for i := range from {
		from[i], to[i] = byte(i), byte(0x20+i)
	}
	v := makeBindingVector(f, from, to, "s1")
	fromID, toID := vectorIdentity(f, from), vectorIdentity(f, to)
	f.Add([]byte(v.Data), "offer", "s1")
	f.Add([]byte(v.Data), "answer", "s1")
	f.Add(bytes.Replace(v.Data, []byte("9F:86"), []byte("9f:86"), 1), "offer", "s1")
	f.Add(bytes.Replace(v.Data, []byte("9F:86"), []byte("9F:87"), 1), "offer", "s1")
	f.Add([]byte(`{"sdp":"a=fingerprint:sha-256 AB\r\n","caps":{"bulk":1},"sig":"AAAA"}`), "offer", "s1")
	f.Add([]byte(`{"sdp":1}`), "offer", "")
	f.Add([]byte(`null`), "offer", "")
	f.Fuzz(func(t *testing.T, data []byte, kind, sid string) {
		d, fps, err := verifyDescription(data, kind, sid, fromID.ID, toID.ID)
		if err != nil {
			return
		}
		got := sdpFingerprints(d.SDP)
		if len(fps) == 0 || len(fps) != len(got) {
			t.Fatalf("accepted %d fingerprints of an SDP with %d", len(fps), len(got))
		}
		for i := range fps {
			if fps[i] != strings.ToLower(got[i]) {
				t.Fatalf("fingerprint %d: %q; SDP has %q", i, fps[i], got[i])
			}
		}
		ok, err := fromID.Key.GetPublic().Verify(bindingPayload(kind, sid, fromID.ID, toID.ID, got, d.Caps), d.Sig)
		if err != nil || !ok {
			t.Fatalf("accepted a description whose signature does not verify: %s", data)
		}
	})
}

// FuzzHaveAnswer: a HAVE answering a WANT, decoded and collected, never
// panics, and what is collected is bounded by what was asked: at most one
// whole-blob entry per CID asked, each one asked for, nothing aliasing the
// frame.
func FuzzHaveAnswer(f *testing.F) {
	asked := func(n uint8) []cas.CID {
		out := make([]cas.CID, int(n)%8)
		for i := range out {
			out[i] = cas.Sum([]byte{byte(i)})
		}
		return out
	}
	seed := asked(3)
	f.Add(wire.AppendHave(nil, 1, []wire.HaveEntry{{CID: seed[0], Size: 5}, {CID: seed[2], Size: 1 << 40}}), uint8(3))
	f.Add(wire.AppendHave(nil, 1, []wire.HaveEntry{{CID: seed[0], Size: 5}, {CID: seed[0], Size: 5}}), uint8(3))
	f.Add(wire.AppendHave(nil, 1, []wire.HaveEntry{{CID: seed[1], Size: 3 << 20, Bitmap: []byte{5}}}), uint8(3))
	f.Add(wire.AppendHave(nil, 1, []wire.HaveEntry{{CID: seed[1], Size: 3 << 20, Bitmap: []byte{5}}}), uint8(0x83))
	f.Add(wire.AppendHave(nil, 1, []wire.HaveEntry{{CID: cas.Sum([]byte("other")), Size: 1}}), uint8(3))
	f.Add(wire.AppendHave(nil, 1, nil), uint8(0))
	f.Add(wire.AppendHave(nil, 1, make([]wire.HaveEntry, 9)), uint8(7))
	f.Fuzz(func(t *testing.T, frame []byte, n uint8) {
		var fr wire.Frame
		if wire.Decode(frame, wire.MaxFrame, &fr) != nil || fr.Type != wire.TypeHave {
			return
		}
		want := asked(n)
		partial := n&0x80 != 0 // we announced CapPartial
		out, err := acceptHave(want, fr.Have, partial)
		if err != nil {
			return
		}
		if len(out) > len(want) {
			t.Fatalf("collected %d entries for %d CIDs", len(out), len(want))
		}
		seen := map[cas.CID]bool{}
		for _, e := range out {
			if seen[e.CID] || e.Bitmap != nil && !partial {
				t.Fatalf("entry %s listed twice or partial", e.CID)
			}
			if e.Bitmap != nil && len(e.Bitmap) != wire.BitmapLen(e.Size) {
				t.Fatalf("entry %s: bitmap of %d bytes for %d bytes", e.CID, len(e.Bitmap), e.Size)
			}
			seen[e.CID] = true
			found := false
			for _, c := range want {
				found = found || c == e.CID
			}
			if !found {
				t.Fatalf("collected %s, which was not asked for", e.CID)
			}
		}
		for i := range frame {
			frame[i] ^= 0xff // the collected entries must not change with the frame
		}
		b, _ := json.Marshal(out)
		for i := range frame {
			frame[i] ^= 0xff
		}
		c, _ := json.Marshal(out)
		if !bytes.Equal(b, c) {
			t.Fatal("collected entries alias the frame")
		}
	})
}
