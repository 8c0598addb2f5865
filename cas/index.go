//go:build !js

package cas

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Buckets of index.db. Keys are the 32 raw digest bytes unless noted.
var (
	bucketBlobs   = []byte("blobs")   // digest -> record
	bucketPins    = []byte("pins")    // digest + pinKind + reason -> unix nanos
	bucketLinks   = []byte("links")   // parent digest -> children digests, concatenated
	bucketRefs    = []byte("refs")    // child digest -> uint64 count of parents linking it
	bucketPartial = []byte("partial") // digest -> uint64 size + bitmap of verified groups
	bucketMeta    = []byte("meta")    // "version" -> uint64
)

// indexVersion 2 keys pins by codec (pinKind); version 1 had one pin per
// digest and reason, and is migrated on open.
const indexVersion = 2

// pinKind is the byte after the digest in a pin key: which CID of the
// blob the pin is for.
const (
	pinRaw        byte = 0
	pinCollection byte = 1
)

func pinKindOf(c CID) byte {
	if c.IsCollection() {
		return pinCollection
	}
	return pinRaw
}

// record is a blob's entry in the index.
type record struct {
	Size     int64
	Added    int64 // unix nanos
	Accessed int64
	Verified int64
	Flags    uint32
}

const (
	// flagCollection: the blob is held as a collection too (it was added
	// or fetched through its collection CID, parsed, and its shards are
	// linked). Its raw CID always reads the bytes as themselves.
	flagCollection uint32 = 1 << iota
	flagCorrupt           // found bad by scrub or a read; never served
)

const recordSize = 8*4 + 4

func (r *record) marshal() []byte {
	b := make([]byte, recordSize)
	binary.LittleEndian.PutUint64(b[0:], uint64(r.Size))
	binary.LittleEndian.PutUint64(b[8:], uint64(r.Added))
	binary.LittleEndian.PutUint64(b[16:], uint64(r.Accessed))
	binary.LittleEndian.PutUint64(b[24:], uint64(r.Verified))
	binary.LittleEndian.PutUint32(b[32:], r.Flags)
	return b
}

func unmarshalRecord(b []byte) (record, error) {
	if len(b) != recordSize {
		return record{}, fmt.Errorf("index record is %d bytes; want %d", len(b), recordSize)
	}
	return record{
		Size:     int64(binary.LittleEndian.Uint64(b[0:])),
		Added:    int64(binary.LittleEndian.Uint64(b[8:])),
		Accessed: int64(binary.LittleEndian.Uint64(b[16:])),
		Verified: int64(binary.LittleEndian.Uint64(b[24:])),
		Flags:    binary.LittleEndian.Uint32(b[32:]),
	}, nil
}

func getRecord(tx *bolt.Tx, c CID) (record, bool, error) {
	v := tx.Bucket(bucketBlobs).Get(c.key())
	if v == nil {
		return record{}, false, nil
	}
	r, err := unmarshalRecord(v)
	if err != nil {
		return record{}, false, fmt.Errorf("index entry of %s: %w", c, err)
	}
	return r, true, nil
}

// getView returns c's record if c is stored: its bytes are, and for a
// collection CID, they are held as a collection.
func getView(tx *bolt.Tx, c CID) (record, bool, error) {
	r, ok, err := getRecord(tx, c)
	if err != nil || !ok || c.IsCollection() && r.Flags&flagCollection == 0 {
		return record{}, false, err
	}
	return r, true, nil
}

func putRecord(tx *bolt.Tx, c CID, r *record) error {
	return tx.Bucket(bucketBlobs).Put(c.key(), r.marshal())
}

func getRefs(tx *bolt.Tx, c CID) int64 {
	v := tx.Bucket(bucketRefs).Get(c.key())
	if len(v) != 8 {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(v))
}

func addRefs(tx *bolt.Tx, c CID, d int64) error {
	n := getRefs(tx, c) + d
	if n <= 0 {
		return tx.Bucket(bucketRefs).Delete(c.key())
	}
	return tx.Bucket(bucketRefs).Put(c.key(), binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// pinKey is the key of c's pin for reason.
func pinKey(c CID, reason string) []byte {
	return append(append(append(make([]byte, 0, 33+len(reason)), c.key()...), pinKindOf(c)), reason...)
}

// pinsOf returns the reasons c (its codec, not the other CID of the same
// bytes) is pinned for, with the time of each.
func pinsOf(tx *bolt.Tx, c CID) []Pin {
	var pins []Pin
	prefix := pinKey(c, "")
	cur := tx.Bucket(bucketPins).Cursor()
	for k, v := cur.Seek(prefix); k != nil && len(k) > len(prefix) && string(k[:len(prefix)]) == string(prefix); k, v = cur.Next() {
		p := Pin{Reason: string(k[len(prefix):])}
		if len(v) == 8 {
			p.Time = time.Unix(0, int64(binary.LittleEndian.Uint64(v)))
		}
		pins = append(pins, p)
	}
	return pins
}

// linksOf returns the children of the blob c names (links are kept per
// digest; only raw children, such as shards, are linked).
func linksOf(tx *bolt.Tx, c CID) []CID {
	v := tx.Bucket(bucketLinks).Get(c.key())
	out := make([]CID, 0, len(v)/32)
	for ; len(v) >= 32; v = v[32:] {
		out = append(out, RawCID(Digest(v)))
	}
	return out
}

func initBuckets(tx *bolt.Tx) error {
	for _, b := range [][]byte{bucketBlobs, bucketPins, bucketLinks, bucketRefs, bucketPartial, bucketMeta} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get([]byte("version")); v != nil {
		if len(v) == 8 && binary.LittleEndian.Uint64(v) == 1 {
			if err := migratePinsV1(tx); err != nil {
				return fmt.Errorf("index version 1 to 2: %w", err)
			}
		} else if len(v) != 8 || binary.LittleEndian.Uint64(v) != indexVersion {
			return fmt.Errorf("index version %x; this peer reads version %d", v, indexVersion)
		} else {
			return nil
		}
	}
	return meta.Put([]byte("version"), binary.LittleEndian.AppendUint64(nil, indexVersion))
}

// migratePinsV1 rewrites version-1 pins (digest + reason) as pins of the
// CID the blob was known by then: its collection CID if it was taken for a
// collection (version 1 printed both as raw), else its raw CID.
func migratePinsV1(tx *bolt.Tx) error {
	b := tx.Bucket(bucketPins)
	type kv struct{ k, v []byte }
	var old []kv
	err := b.ForEach(func(k, v []byte) error {
		old = append(old, kv{append([]byte(nil), k...), append([]byte(nil), v...)})
		return nil
	})
	if err != nil {
		return err
	}
	for _, p := range old {
		if err := b.Delete(p.k); err != nil {
			return err
		}
		if len(p.k) <= 32 {
			continue
		}
		c := RawCID(Digest(p.k))
		if r, ok, err := getRecord(tx, c); err == nil && ok && r.Flags&flagCollection != 0 {
			c = CollectionCID(c.Digest())
		}
		if err := b.Put(pinKey(c, string(p.k[32:])), p.v); err != nil {
			return err
		}
	}
	return nil
}
