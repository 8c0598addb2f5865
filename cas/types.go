package cas

// The types and constants of this file build for every platform, js/wasm
// included: a browser peer names, verifies and reassembles blobs with them
// without the Store (bbolt and files), which is native only.

import (
	"time"

	"github.com/rdrr/peer/cas/bao"
)

// GroupSize is the unit of verification: every 16 KiB group of a blob is
// checked against the CID before it is used.
const GroupSize = bao.GroupSize

// SliceLen is the length of the bao slice encoding of [off, off+n) of a
// blob of size bytes (see package bao for the format).
func SliceLen(size, off, n int64) int64 { return bao.SliceLen(size, off, n) }

// Range is a byte range of a blob.
type Range struct {
	Off int64 `json:"off"`
	Len int64 `json:"len"`
}

// Pin is one reason a blob is kept by GC.
type Pin struct {
	Reason string    `json:"reason"`
	Time   time.Time `json:"time"`
}

// Info describes a stored blob, as seen through one CID: Collection, Pins
// and the CID itself are those of that CID (the raw and the collection CID
// of the same bytes share the blob, its size, times, links and refs).
type Info struct {
	CID        CID       `json:"cid"`
	Size       int64     `json:"size"`
	Collection bool      `json:"collection,omitempty"` // CID is a collection CID
	Corrupt    bool      `json:"corrupt,omitempty"`
	Added      time.Time `json:"added"`
	Accessed   time.Time `json:"accessed"`
	Verified   time.Time `json:"verified"`
	Pins       []Pin     `json:"pins,omitempty"`
	Refs       int64     `json:"refs,omitempty"`
}
