package p2p

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/rdrr/peer/cas"
)

func haveCIDs(n int) []cas.CID {
	out := make([]cas.CID, n)
	for i := range out {
		c := cas.Sum([]byte{byte(i), byte(i >> 8)})
		if i%3 == 0 {
			c = cas.CollectionCID(c.Digest())
		}
		out[i] = c
	}
	return out
}

func TestHaveRoundTrip(t *testing.T) {
	for _, n := range []int{1, 2, 127, 128, MaxHaveCIDs} {
		a := HaveAnnouncement{CIDs: haveCIDs(n)}
		b, err := a.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		if n == MaxHaveCIDs && len(b) != MaxHaveBytes {
			t.Fatalf("largest announcement is %d bytes; MaxHaveBytes %d", len(b), MaxHaveBytes)
		}
		var got HaveAnnouncement
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !slices.Equal(got.CIDs, a.CIDs) {
			t.Fatalf("n=%d: round trip differs", n)
		}
	}
}

func TestHaveMarshalRefuses(t *testing.T) {
	c := cas.Sum([]byte("c"))
	for name, cids := range map[string][]cas.CID{
		"none":        nil,
		"too many":    haveCIDs(MaxHaveCIDs + 1),
		"duplicate":   {c, c},
		"same digest": {c, cas.CollectionCID(c.Digest())},
	} {
		if _, err := (HaveAnnouncement{CIDs: cids}).MarshalBinary(); !errors.Is(err, ErrBadHave) {
			t.Errorf("%s: %v; want ErrBadHave", name, err)
		}
	}
}

func TestHaveUnmarshalStrict(t *testing.T) {
	one, _ := HaveAnnouncement{CIDs: haveCIDs(1)}.MarshalBinary()
	two, _ := HaveAnnouncement{CIDs: haveCIDs(2)}.MarshalBinary()
	dup := append(append([]byte{1, 2}, one[2:]...), one[2:]...)
	nonCanonical := append([]byte{1, 0x81, 0x00}, one[2:]...) // 1 as two bytes
	badKind := append([]byte(nil), one...)
	badKind[2] = 2
	for name, b := range map[string][]byte{
		"empty":          {},
		"version 0":      append([]byte{0}, one[1:]...),
		"version 2":      append([]byte{2}, one[1:]...),
		"no count":       {1},
		"count 0":        {1, 0},
		"count too big":  {1, 0x81, 0x08}, // 1025
		"short":          one[:len(one)-1],
		"trailing":       append(append([]byte(nil), one...), 0),
		"count mismatch": append([]byte{1, 1}, two[2:]...),
		"duplicate":      dup,
		"non-canonical":  nonCanonical,
		"bad kind":       badKind,
		"too long":       bytes.Repeat([]byte{1}, MaxHaveBytes+1),
	} {
		var a HaveAnnouncement
		if err := a.UnmarshalBinary(b); !errors.Is(err, ErrBadHave) {
			t.Errorf("%s: %v; want ErrBadHave", name, err)
		}
	}
}

func TestHaveTopicName(t *testing.T) {
	if n, err := HaveTopic("rdrr"); err != nil || n != "/rdrr/have/rdrr" {
		t.Fatalf("HaveTopic(rdrr) = %q, %v", n, err)
	}
	for _, bad := range []string{"", "a\nb", string(make([]byte, 257))} {
		if _, err := HaveTopic(bad); err == nil {
			t.Errorf("HaveTopic(%q) accepted", bad)
		}
	}
}

// FuzzHaveAnnouncement: no input panics the decoder, and whatever it
// accepts is the canonical encoding of a bounded announcement.
func FuzzHaveAnnouncement(f *testing.F) {
	for _, n := range []int{1, 3, 200} {
		b, _ := HaveAnnouncement{CIDs: haveCIDs(n)}.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{1, 0x81, 0x00})
	f.Add([]byte{1, 1, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var a HaveAnnouncement
		if err := a.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrBadHave) {
				t.Fatalf("error %v does not wrap ErrBadHave", err)
			}
			return
		}
		if len(a.CIDs) < 1 || len(a.CIDs) > MaxHaveCIDs {
			t.Fatalf("accepted %d CIDs", len(a.CIDs))
		}
		again, err := a.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted input does not encode: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("accepted a non-canonical encoding:\n in  %x\n out %x", b, again)
		}
	})
}
