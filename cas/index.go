package cas

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Buckets of index.db. Keys are the 32 raw digest bytes unless noted.
var (
	bucketBlobs   = []byte("blobs")   // CID -> record
	bucketPins    = []byte("pins")    // CID + reason -> unix nanos
	bucketLinks   = []byte("links")   // parent CID -> children CIDs, concatenated
	bucketRefs    = []byte("refs")    // child CID -> uint64 count of parents linking it
	bucketPartial = []byte("partial") // CID -> uint64 size + bitmap of verified groups
	bucketMeta    = []byte("meta")    // "version" -> uint64
)

const indexVersion = 1

// record is a blob's entry in the index.
type record struct {
	Size     int64
	Added    int64 // unix nanos
	Accessed int64
	Verified int64
	Flags    uint32
}

const (
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
	v := tx.Bucket(bucketBlobs).Get(c[:])
	if v == nil {
		return record{}, false, nil
	}
	r, err := unmarshalRecord(v)
	if err != nil {
		return record{}, false, fmt.Errorf("index entry of %s: %w", c, err)
	}
	return r, true, nil
}

func putRecord(tx *bolt.Tx, c CID, r *record) error {
	return tx.Bucket(bucketBlobs).Put(c[:], r.marshal())
}

func getRefs(tx *bolt.Tx, c CID) int64 {
	v := tx.Bucket(bucketRefs).Get(c[:])
	if len(v) != 8 {
		return 0
	}
	return int64(binary.LittleEndian.Uint64(v))
}

func addRefs(tx *bolt.Tx, c CID, d int64) error {
	n := getRefs(tx, c) + d
	if n <= 0 {
		return tx.Bucket(bucketRefs).Delete(c[:])
	}
	return tx.Bucket(bucketRefs).Put(c[:], binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// pinsOf returns the reasons c is pinned for, with the time of each.
func pinsOf(tx *bolt.Tx, c CID) []Pin {
	var pins []Pin
	cur := tx.Bucket(bucketPins).Cursor()
	for k, v := cur.Seek(c[:]); k != nil && len(k) > 32 && CID(k[:32]) == c; k, v = cur.Next() {
		p := Pin{Reason: string(k[32:])}
		if len(v) == 8 {
			p.Time = time.Unix(0, int64(binary.LittleEndian.Uint64(v)))
		}
		pins = append(pins, p)
	}
	return pins
}

func linksOf(tx *bolt.Tx, c CID) []CID {
	v := tx.Bucket(bucketLinks).Get(c[:])
	out := make([]CID, 0, len(v)/32)
	for ; len(v) >= 32; v = v[32:] {
		out = append(out, CID(v[:32]))
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
		if len(v) != 8 || binary.LittleEndian.Uint64(v) != indexVersion {
			return fmt.Errorf("index version %x; this peer reads version %d", v, indexVersion)
		}
		return nil
	}
	return meta.Put([]byte("version"), binary.LittleEndian.AppendUint64(nil, indexVersion))
}
