package signaling

import (
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
	})
}
