package cas

import (
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/rdrr/peer/cas/bao"
)

// Digest is the BLAKE3-256 hash of a blob's bytes. The store keys blobs by
// it and the wire carries it, so the same bytes named by a raw CID and by a
// collection CID are one stored blob.
type Digest [32]byte

// Codec is the multicodec of a CID: it says how the blob's bytes are read.
type Codec uint64

const (
	// CodecRaw (0x55, "raw") names bytes that are read as themselves.
	CodecRaw Codec = 0x55
	// CodecCollection (0x300001, in the multicodec private-use range
	// 0x300000-0x3FFFFF) names a collection blob: its bytes are the JSON
	// of FORMAT.md, and the CID reads as the file its shards make. The
	// JSON is not dag-json (links are strings, keys are not sorted), so no
	// registered IPLD codec fits; a private code makes IPFS tools refuse to
	// decode it rather than misread it. See FORMAT.md.
	CodecCollection Codec = 0x300001
)

// String returns the codec's name.
func (c Codec) String() string {
	switch c {
	case CodecRaw:
		return "raw"
	case CodecCollection:
		return "rdrr-collection-v1"
	}
	return fmt.Sprintf("codec(%#x)", uint64(c))
}

// CID names a blob and says how to read it: the BLAKE3-256 digest of its
// bytes and a codec, raw (the bytes are the data) or collection (the bytes
// list the shards of a file). It prints as a CIDv1 in multibase base32
// with multihash BLAKE3-256 (0x1e): "bafkr4i..." for raw, "bagaybqabdyq..."
// for a collection. The manifest's 64-digit hex spelling of a digest is
// accepted wherever a CID is, and names the raw CID. The zero CID is raw.
type CID struct {
	digest     Digest
	collection bool
}

// cidTail is the multihash header after the codec: BLAKE3, 32 bytes.
var cidTail = [2]byte{0x1e, 0x20}

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// RawCID returns the raw CID of the blob with digest d.
func RawCID(d Digest) CID { return CID{digest: d} }

// CollectionCID returns the collection CID of the collection blob with
// digest d.
func CollectionCID(d Digest) CID { return CID{digest: d, collection: true} }

// Sum returns the raw CID of p.
func Sum(p []byte) CID { return RawCID(Digest(bao.Sum256(p))) }

// Digest returns the BLAKE3-256 digest of the blob's bytes.
func (c CID) Digest() Digest { return c.digest }

// AppendDigest appends the 32 digest bytes to b (what the wire carries).
func (c CID) AppendDigest(b []byte) []byte { return append(b, c.digest[:]...) }

// Codec returns how the blob's bytes are read.
func (c CID) Codec() Codec {
	if c.collection {
		return CodecCollection
	}
	return CodecRaw
}

// IsCollection reports whether c is a collection CID.
func (c CID) IsCollection() bool { return c.collection }

// Raw returns the raw CID of the same bytes.
func (c CID) Raw() CID { return RawCID(c.digest) }

// key is the index key of c's blob: the digest (codecs share storage).
func (c CID) key() []byte { return c.digest[:] }

// Binary returns the binary CIDv1: the version (1), the codec and the
// multihash code (0x1e) as unsigned varints, the digest length (32) and
// the digest.
func (c CID) Binary() []byte {
	b := binary.AppendUvarint(make([]byte, 1, 40), uint64(c.Codec()))
	b[0] = 0x01
	b = append(b, cidTail[:]...)
	return append(b, c.digest[:]...)
}

// ParseCID parses a CIDv1 BLAKE3-256 with codec raw ("bafkr4i...") or
// collection ("bagaybqabdyq...") in multibase base32 (lower case "b", or
// upper case "B"), or a 64-digit hex BLAKE3 digest, which names the raw
// CID. Only the canonical encoding is accepted. Errors wrap ErrBadCID.
func ParseCID(s string) (CID, error) {
	switch {
	case len(s) == 64 && isHex(s):
		var d Digest
		if _, err := hex.Decode(d[:], []byte(s)); err != nil {
			return CID{}, fmt.Errorf("%w: %q: %v", ErrBadCID, s, err)
		}
		return RawCID(d), nil
	case len(s) > 1 && (s[0] == 'b' || s[0] == 'B'):
		body := s[1:]
		if s[0] == 'B' {
			body = strings.ToLower(body)
		}
		var c CID
		switch len(body) {
		case b32.EncodedLen(len(RawCID(Digest{}).Binary())):
		case b32.EncodedLen(len(CollectionCID(Digest{}).Binary())):
			c.collection = true
		default:
			return CID{}, fmt.Errorf("%w: %q: wrong length for a BLAKE3-256 CID", ErrBadCID, s)
		}
		raw, err := b32.DecodeString(body)
		// encoding/base32 skips '\r' and '\n', so a body of the right
		// length can decode short: the decoded length is checked too.
		if err != nil || len(raw) != len(c.Binary()) {
			return CID{}, fmt.Errorf("%w: %q: not base32", ErrBadCID, s)
		}
		head := len(raw) - len(c.digest)
		if want := c.Binary()[:head]; string(raw[:head]) != string(want) {
			return CID{}, fmt.Errorf("%w: %q: not a CIDv1 %s BLAKE3-256 (prefix %x; want %x)", ErrBadCID, s, c.Codec(), raw[:head], want)
		}
		copy(c.digest[:], raw[head:])
		// Reject non-canonical spellings (trailing bits set) so one blob
		// has one name.
		if c.String() != "b"+body {
			return CID{}, fmt.Errorf("%w: %q: non-canonical base32", ErrBadCID, s)
		}
		return c, nil
	}
	return CID{}, fmt.Errorf("%w: %q: want bafkr4i..., bagaybqabdyq... or 64 hex digits", ErrBadCID, s)
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
func (c CID) String() string { return "b" + b32.EncodeToString(c.Binary()) }

// Hex returns the digest as 64 lower-case hex digits (the manifest spelling).
func (c CID) Hex() string { return hex.EncodeToString(c.digest[:]) }

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
