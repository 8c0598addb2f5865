package wire

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rdrr/peer/cas"
)

var (
	cidA = cas.Sum([]byte("a"))
	cidB = cas.Sum([]byte("b"))
)

func hello() Hello {
	return Hello{Version: Version, Caps: CapServe | CapBigMTU, MaxFrame: MaxFrame, MaxRequest: 1 << 20, MaxOutstanding: 16, Agent: "rdrr-peer/test"}
}

// validFrames is one encoded frame of every type (also the fuzz seeds).
func validFrames() map[string][]byte {
	return map[string][]byte{
		"hello":        AppendHello(nil, hello()),
		"have":         AppendHave(nil, 7, []HaveEntry{{CID: cidA, Size: 3 << 20}, {CID: cidB, Size: 5<<20 + 1, Bitmap: []byte{0b101011}}}),
		"have-empty":   AppendHave(nil, 8, nil),
		"want":         AppendWant(nil, 9, []cas.CID{cidA, cidB}),
		"request":      AppendRequest(nil, 10, cidA, 1<<20, 1<<20),
		"piece":        AppendPiece(nil, 10, 4096, bytes.Repeat([]byte{0xab}, 1000)),
		"cancel":       AppendCancel(nil, 10),
		"reject":       AppendReject(nil, 10, CodeNotFound, "no such blob"),
		"reject-conn":  AppendReject(nil, 0, CodeBadData, "group [16384, 32768) of bafk... failed verification"),
		"piece-maxlen": AppendPiece(nil, 1, 0, make([]byte, MaxPieceData)),
	}
}

func TestRoundTrip(t *testing.T) {
	var f Frame
	for name, b := range validFrames() {
		if err := Decode(b, MaxFrame, &f); err != nil {
			t.Errorf("%s: Decode: %v", name, err)
			continue
		}
		if got := Append(nil, &f); !bytes.Equal(got, b) {
			t.Errorf("%s: re-encoded %x; want %x", name, got, b)
		}
	}
	if err := Decode(AppendRequest(nil, 3, cidB, 16384, 32768), MaxFrame, &f); err != nil {
		t.Fatal(err)
	}
	if f.Type != TypeRequest || f.Req != 3 || f.CID != cidB || f.Off != 16384 || f.Len != 32768 {
		t.Fatalf("request = %+v", f)
	}
	if err := Decode(validFrames()["have"], MaxFrame, &f); err != nil {
		t.Fatal(err)
	}
	want := []HaveEntry{{CID: cidA, Size: 3 << 20}, {CID: cidB, Size: 5<<20 + 1, Bitmap: []byte{0b101011}}}
	if !reflect.DeepEqual(f.Have, want) {
		t.Fatalf("have = %+v; want %+v", f.Have, want)
	}
}

func TestDecodeRejects(t *testing.T) {
	corrupt := func(b []byte, i int, v byte) []byte {
		c := bytes.Clone(b)
		c[i] = v
		return c
	}
	fr := validFrames()
	h := hello()
	h.MaxFrame = 100
	badHello := AppendHello(nil, h)
	h = hello()
	h.MaxOutstanding = 0
	noOutstanding := AppendHello(nil, h)
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "shorter than its header"},
		{"short length", corrupt(fr["cancel"], 3, 4), "length prefix"},
		{"long length", corrupt(fr["cancel"], 3, 6), "length prefix"},
		{"unknown type", corrupt(fr["cancel"], 4, 99), "unknown frame type"},
		{"request truncated", truncated(fr["request"]), "body is"},
		{"piece without data", AppendPiece(nil, 1, 0, nil), "no data"},
		{"hello max_frame", badHello, "max_frame"},
		{"hello max_outstanding", noOutstanding, "max_outstanding"},
		{"have bad flags", corrupt(fr["have"], HeaderSize+6+40, 7), "unknown flags"},
		{"have bitmap tail", AppendHave(nil, 1, []HaveEntry{{CID: cidA, Size: 1 << 20, Bitmap: []byte{0b10}}}), "past the last piece"},
		{"want none", AppendWant(nil, 1, nil), "0 CIDs"},
		{"want more than an answer holds", AppendWant(nil, 1, make([]cas.CID, MaxWant+1)), "CIDs; want 1.."},
		{"reject bad utf8", AppendReject(nil, 1, CodeBusy, "\xff"), "UTF-8"},
	}
	for _, tc := range cases {
		var f Frame
		err := Decode(tc.in, MaxFrame, &f)
		var we *Error
		if !errors.As(err, &we) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Decode = %v; want a *wire.Error containing %q", tc.name, err, tc.want)
		}
	}
	big := AppendPiece(nil, 1, 0, make([]byte, MaxPieceData+1))
	var tl *TooLargeError
	if err := Decode(big, MaxFrame, new(Frame)); !errors.As(err, &tl) || tl.Len != MaxFrame+1 {
		t.Fatalf("oversize frame: %v; want TooLargeError", err)
	}
}

// A REQUEST's range is the server's to judge (REJECT bad_request, with the
// connection kept): every 48-byte REQUEST decodes.
func TestRequestRangeIsNotMalformed(t *testing.T) {
	for _, n := range []uint32{0, MaxRequest + 1, 1<<32 - 1} {
		b := AppendRequest(nil, 1, cidA, 1<<63+5, n)
		var f Frame
		if err := Decode(b, MaxFrame, &f); err != nil || f.Len != n || f.Off != 1<<63+5 {
			t.Errorf("REQUEST of length %d: %v, %+v; want it decoded", n, err, f)
		}
	}
}

// The answer to the largest WANT fits one frame, for every pair of
// max_frame values.
func TestWantAnswerFits(t *testing.T) {
	for _, mf := range [][2]int{{MaxFrame, MaxFrame}, {MinFrame, MaxFrame}, {MaxFrame, MinFrame}, {MinFrame, MinFrame}, {5000, 60000}} {
		n := WantLimit(mf[0], mf[1])
		if n < 1 {
			t.Fatalf("WantLimit(%d, %d) = %d", mf[0], mf[1], n)
		}
		cids := make([]cas.CID, n)
		entries := make([]HaveEntry, n)
		if got := len(AppendWant(nil, 1, cids)); got > mf[0] {
			t.Errorf("WANT of %d CIDs is %d bytes; server max_frame %d", n, got, mf[0])
		}
		if got := len(AppendHave(nil, 1, entries)); got > mf[1] {
			t.Errorf("HAVE of %d entries is %d bytes; requester max_frame %d", n, got, mf[1])
		}
	}
	if got := len(AppendHave(nil, 1, make([]HaveEntry, MaxWant+1))); got <= MaxFrame {
		t.Errorf("MaxWant %d is not the most: %d entries still fit (%d bytes)", MaxWant, MaxWant+1, got)
	}
}

// truncated drops b's last byte and fixes the length prefix.
func truncated(b []byte) []byte {
	c := bytes.Clone(b[:len(b)-1])
	be.PutUint32(c, uint32(len(c)-4))
	return c
}

func TestRejectTruncatesReason(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	var f Frame
	if err := Decode(AppendReject(nil, 0, CodeProtocol, long), MaxFrame, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Reason) > MaxReason || !strings.HasPrefix(long, f.Reason) {
		t.Fatalf("reason %q", f.Reason)
	}
}

// FuzzDecode: no input panics or allocates past its size; every accepted
// frame re-encodes to exactly its input (the encoding is canonical).
func FuzzDecode(f *testing.F) {
	for _, b := range validFrames() {
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var fr Frame
		if err := Decode(b, MaxFrame, &fr); err != nil {
			return
		}
		if got := Append(nil, &fr); !bytes.Equal(got, b) {
			t.Fatalf("re-encoded %x; input %x", got, b)
		}
	})
}
