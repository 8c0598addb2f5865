package signaling

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const (
	idA = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
	idB = "12D3KooWPjceQrSwdWXPyLLeABRXmuqt69Rg3sBYbU1Nft9HyQ6X"
)

func TestDecodeMessage(t *testing.T) {
	cases := []struct {
		in   string
		err  error // nil: valid
		want string
	}{
		{`{"type":"join","req":1,"topic":"swarm"}`, nil, ""},
		{`{"type":"offer","to":"` + idA + `","sid":"s1","data":{"sdp": "v=0"}}`, nil, ""},
		{`{"type":"auth","v":1,"id":"` + idA + `","sig":"AAAA"}`, nil, ""},
		{`{"type":"challenge","v":1,"nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`, nil, ""},
		{`{"type":"peers","topic":"t","peers":["` + idA + `","` + idB + `"]}`, nil, ""},
		{`{"type":"error","code":"rate_limited"}`, nil, ""},
		{`{"type":"ping","future_field":[1,2]}`, nil, ""},
		{`{"type":"bye","to":"` + idA + `","sid":"s1"}`, nil, ""},
		// Keys that are not fields are ignored, whatever their case, and
		// so is what data holds.
		{`{"type":"ping","Future":1,"future":2}`, nil, ""},
		{`{"type":"offer","to":"` + idA + `","sid":"s1","data":{"a":1,"a":2,"A":3}}`, nil, ""},

		{`not json`, ErrBadMessage, "not a JSON"},
		{`{}`, ErrBadMessage, "missing type"},
		{`{"type":"teleport"}`, ErrUnknownType, "unknown type"},
		{`{"type":"join"}`, ErrBadMessage, "missing topic"},
		{`{"type":"join","topic":"a\u0000b"}`, ErrBadMessage, "control"},
		{`{"type":"join","topic":"` + strings.Repeat("t", 257) + `"}`, ErrBadMessage, "topic"},
		{`{"type":"offer","to":"` + idA + `","sid":"s1"}`, ErrBadMessage, "missing data"},
		{`{"type":"offer","to":"nope","sid":"s1","data":{}}`, ErrBadMessage, "not a peer id"},
		{`{"type":"offer","to":"` + idA + `","data":{}}`, ErrBadMessage, "missing sid"},
		{`{"type":"offer","to":"` + idA + `","sid":"a b","data":{}}`, ErrBadMessage, "printable"},
		{`{"type":"auth","v":2,"id":"` + idA + `","sig":"AAAA"}`, ErrVersion, "version 2"},
		{`{"type":"auth","v":1,"id":"` + idA + `"}`, ErrBadMessage, "sig"},
		{`{"type":"challenge","v":1,"nonce":"AAAA"}`, ErrBadMessage, "nonce"},
		{`{"type":"ping","req":9007199254740992}`, ErrBadMessage, "2^53"},
		{`{"type":"ping","req":-1}`, ErrBadMessage, "JSON"},
		{"{\"type\":\"ping\",\"reason\":\"\xff\"}", ErrBadMessage, "UTF-8"},

		// Keys are exact: no duplicates, no case variants of known keys
		// (which encoding/json alone would fold onto them).
		{`{"type":"ping","type":"join","topic":"t"}`, ErrBadMessage, "given twice"},
		{`{"type":"ping","\u0074ype":"join","topic":"t"}`, ErrBadMessage, "given twice"},
		{`{"type":"ping","tYpe":"join","topic":"t"}`, ErrBadMessage, "case-sensitive"},
		{`{"tYpe":"ping"}`, ErrBadMessage, "case-sensitive"},
		{`{"TYPE":"ping"}`, ErrBadMessage, "case-sensitive"},
		{`{"type":"offer","to":"` + idA + `","ſid":"s1","data":{}}`, ErrBadMessage, "case-sensitive"},
		{`{"type":"auth","v":1,"id":"` + idA + `","sig":"AAAA","puB":""}`, ErrBadMessage, "case-sensitive"},
		{`{"type":"ping","x":1,"x":2}`, ErrBadMessage, "given twice"},
		{`{"type":"challenge","v":1,"nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","limits":{"burst":1,"burst":2}}`, ErrBadMessage, "limits.burst"},
		{`{"type":"challenge","v":1,"nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","limits":{"Burst":1}}`, ErrBadMessage, "limits.Burst"},
	}
	for _, tc := range cases {
		m, err := DecodeMessage([]byte(tc.in))
		if tc.err == nil {
			if err != nil {
				t.Errorf("DecodeMessage(%s) = %v; want ok", tc.in, err)
			}
			continue
		}
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeMessage(%s) = %v, %v; want %v containing %q", tc.in, m, err, tc.err, tc.want)
		}
	}
}

// Empty binary fields and peer lists decode as absent: Encode omits both
// alike, so anything else would not round-trip (the FuzzDecodeMessage
// crasher in testdata/fuzz).
func TestDecodeEmptyIsAbsent(t *testing.T) {
	m, err := DecodeMessage([]byte(`{"type":"auth","v":1,"id":"` + idA + `","sig":"AAAA","pub":"","nonce":""}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.PubKey != nil || m.Nonce != nil {
		t.Fatalf("pub = %#v, nonce = %#v; want nil", m.PubKey, m.Nonce)
	}
	m, err = DecodeMessage([]byte(`{"type":"peers","topic":"t","peers":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.Peers != nil {
		t.Fatalf("peers = %#v; want nil", m.Peers)
	}
}

func TestDecodeCompactsData(t *testing.T) {
	m, err := DecodeMessage([]byte(`{"type":"offer","to":"` + idA + `","sid":"s","data":{ "a" : [1, 2] }}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(m.Data), `{"a":[1,2]}`; got != want {
		t.Fatalf("data = %s; want %s", got, want)
	}
}

// FuzzDecodeMessage: no input panics, and whatever decodes re-encodes to a
// message that decodes to the same value.
func FuzzDecodeMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"join","req":1,"topic":"swarm"}`,
		`{"type":"offer","to":"` + idA + `","sid":"s1","data":{"sdp":"v=0\r\n","sig":"AAAA"}}`,
		`{"type":"candidate","from":"` + idB + `","sid":"s1","data":{"candidate":"candidate:1 1 udp 1 127.0.0.1 5000 typ host"}}`,
		`{"type":"auth","v":1,"id":"` + idA + `","sig":"AAAA","pub":"CAESIA=="}`,
		`{"type":"challenge","v":1,"nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","limits":{"max_message_bytes":65536}}`,
		`{"type":"peers","req":2,"topic":"t","peers":["` + idA + `"]}`,
		`{"type":"error","req":3,"code":"unknown_peer","peer":"` + idB + `","reason":"gone"}`,
		`{"type":"ping"}`,
		`[]`, `null`, `{"type":1}`,
		`{"type":"auth","v":1,"id":"` + idA + `","sig":"AAAA","pub":""}`,
		`{"type":"peers","topic":"t","peers":[]}`,
		`{"type":"ping","tYpe":"auth"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			return
		}
		enc, err := m.Encode()
		if err != nil {
			t.Fatalf("encode %+v: %v", m, err)
		}
		m2, err := DecodeMessage(enc)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", enc, err)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("round trip changed the message:\n%+v\n%+v", m, m2)
		}
		enc2, err := m2.Encode()
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable:\n%s\n%s (%v)", enc, enc2, err)
		}
	})
}
