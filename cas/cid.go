package cas

import (
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/rdrr/peer/cas/bao"
)

// CID names a blob: the BLAKE3-256 digest of its bytes. It prints as a
// CIDv1 (codec raw 0x55, multihash BLAKE3-256 0x1e) in multibase base32,
// "bafkr4i..."; the manifest's 64-digit hex spelling of the same digest is
// accepted wherever a CID is.
type CID [32]byte

// cidPrefix is the binary CIDv1 header: version 1, codec raw, multihash
// blake3, digest length 32 (all single-byte varints).
var cidPrefix = [4]byte{0x01, 0x55, 0x1e, 0x20}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Sum returns the CID of p.
func Sum(p []byte) CID { return CID(bao.Sum256(p)) }

// ParseCID parses a CIDv1 raw BLAKE3-256 in base32 ("bafkr4i...") or a
// 64-digit hex BLAKE3 digest. Errors wrap ErrBadCID.
func ParseCID(s string) (CID, error) {
	var c CID
	switch {
	case len(s) == 64 && isHex(s):
		if _, err := hex.Decode(c[:], []byte(s)); err != nil {
			return CID{}, fmt.Errorf("%w: %q: %v", ErrBadCID, s, err)
		}
		return c, nil
	case len(s) > 1 && (s[0] == 'b' || s[0] == 'B'):
		body := s[1:]
		if s[0] == 'B' {
			body = strings.ToLower(body)
		}
		if len(body) != b32.EncodedLen(len(cidPrefix)+len(c)) {
			return CID{}, fmt.Errorf("%w: %q: wrong length for a BLAKE3-256 raw CID", ErrBadCID, s)
		}
		var raw [36]byte
		n, err := b32.Decode(raw[:], []byte(body))
		if err != nil || n != len(raw) {
			return CID{}, fmt.Errorf("%w: %q: not base32", ErrBadCID, s)
		}
		if [4]byte(raw[:4]) != cidPrefix {
			return CID{}, fmt.Errorf("%w: %q: not a CIDv1 raw BLAKE3-256 (prefix %x)", ErrBadCID, s, raw[:4])
		}
		copy(c[:], raw[4:])
		// Reject non-canonical spellings (trailing bits set) so one blob
		// has one name.
		if c.String() != "b"+body {
			return CID{}, fmt.Errorf("%w: %q: non-canonical base32", ErrBadCID, s)
		}
		return c, nil
	}
	return CID{}, fmt.Errorf("%w: %q: want bafkr4i... or 64 hex digits", ErrBadCID, s)
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// String returns the canonical CIDv1 base32 form.
func (c CID) String() string {
	var raw [36]byte
	copy(raw[:], cidPrefix[:])
	copy(raw[4:], c[:])
	return "b" + b32.EncodeToString(raw[:])
}

// Hex returns the digest as 64 lower-case hex digits (the manifest spelling).
func (c CID) Hex() string { return hex.EncodeToString(c[:]) }

// IsZero reports whether c is the zero CID (no blob has it).
func (c CID) IsZero() bool { return c == CID{} }

// MarshalText implements encoding.TextMarshaler (JSON uses the CID form).
func (c CID) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler; both spellings work.
func (c *CID) UnmarshalText(b []byte) error {
	p, err := ParseCID(string(b))
	if err != nil {
		return err
	}
	*c = p
	return nil
}
