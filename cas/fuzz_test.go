package cas

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/rdrr/peer/cas/bao"
)

// ParseCID never panics, accepts only what it prints back the same way,
// and every accepted CID round-trips through both spellings.
func FuzzParseCID(f *testing.F) {
	c := Sum([]byte("seed"))
	cc := CollectionCID(c.Digest())
	for _, s := range []string{c.String(), c.Hex(), "bafkr4i", "", "B" + c.String()[1:], "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku",
		cc.String(), "B" + cc.String()[1:], "bagaybqabdyq"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCID(s)
		if err != nil {
			return
		}
		if c2, err := ParseCID(c.String()); err != nil || c2 != c {
			t.Fatalf("%q parsed to %v, whose spelling %q does not round-trip: %v", s, c, c.String(), err)
		}
		// The hex spelling names the raw CID of the same digest.
		if c2, err := ParseCID(c.Hex()); err != nil || c2 != c.Raw() {
			t.Fatalf("%q parsed to %v, whose hex %q does not parse to its raw CID: %v", s, c, c.Hex(), err)
		}
		if !strings.EqualFold(s, c.String()) && !strings.EqualFold(s, c.Hex()) {
			t.Fatalf("%q accepted as %v, which is not one of its spellings", s, c)
		}
	})
}

// DecodeSlice is the parser of range proofs from peers: whatever the bytes,
// it never panics, and it accepts a slice only if the data it returns is
// exactly the blob's.
func FuzzDecodeSlice(f *testing.F) {
	data := randData(1, 5*GroupSize+300)
	size := int64(len(data))
	var e bao.Encoder
	e.Write(data)
	root, ob := e.Sum(nil)
	for _, r := range [][2]int64{{0, size}, {GroupSize + 1, 2 * GroupSize}, {size - 1, 1}, {0, 1}} {
		start, end := bao.Cover(size, r[0], r[1])
		slice, _ := bao.AppendSlice(nil, ob, data[start:end], size, r[0], r[1])
		f.Add(slice, r[0], r[1])
	}
	var scratch [bao.GroupSize]byte
	dst := make([]byte, size+GroupSize)
	f.Fuzz(func(t *testing.T, slice []byte, off, n int64) {
		err := bao.DecodeSlice(dst, slice, root, size, off, n, &scratch)
		if err != nil {
			return
		}
		start, end := bao.Cover(size, off, n)
		if !bytes.Equal(dst[:end-start], data[start:end]) {
			t.Fatalf("accepted a slice of [%d,+%d) whose data is wrong", off, n)
		}
	})
}

// Collections from peers are parsed strictly and re-marshal canonically.
func FuzzParseCollection(f *testing.F) {
	col := &Collection{Size: 3, Shards: []Shard{{Sum([]byte("a")), 1}, {Sum([]byte("b")), 2}}}
	f.Add(col.Marshal())
	f.Add([]byte(collectionMagic + `,"size":0,"shards":[]}`))
	f.Add(binary.LittleEndian.AppendUint64([]byte(collectionMagic), 7))
	f.Fuzz(func(t *testing.T, b []byte) {
		col, err := ParseCollection(b)
		if err != nil {
			return
		}
		var sum int64
		for _, s := range col.Shards {
			sum += s.Size
		}
		if sum != col.Size {
			t.Fatalf("accepted collection whose shards add to %d, not %d", sum, col.Size)
		}
		if _, err := ParseCollection(col.Marshal()); err != nil {
			t.Fatalf("re-marshaled collection does not parse: %v", err)
		}
	})
}

// The partial-download record is read back from the index after crashes
// and from damaged disks: whatever its bytes, decoding never panics,
// allocates no more than the record's own length, and accepts only what it
// would write back byte for byte.
func FuzzPartialRecord(f *testing.F) {
	f.Add(encodePartialRecord(0, []uint64{1}))
	f.Add(encodePartialRecord(100*GroupSize+1, []uint64{^uint64(0), 0x1f}))
	f.Add(encodePartialRecord(64*GroupSize, []uint64{1 << 63}))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<61))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, v []byte) {
		size, have, err := decodePartialRecord(v)
		if err != nil {
			return
		}
		if 8*len(have) > len(v) {
			t.Fatalf("record of %d bytes decoded to %d bitmap words", len(v), len(have))
		}
		if back := encodePartialRecord(size, have); !bytes.Equal(back, v) {
			t.Fatalf("record %x decoded to size %d, %x, which encodes as %x", v, size, have, back)
		}
		if groups := bao.Groups(size); int64(countWords(have)) > groups {
			t.Fatalf("record claims %d groups of %d", countWords(have), groups)
		}
	})
}
