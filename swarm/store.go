package swarm

import (
	"context"

	"github.com/rdrr/peer/cas"
)

// Store is what a fetch writes to (FetchTo). *cas.Store is one, through
// Fetch; a browser peer keeps its blobs in the page's storage
// (package web). It has four methods, not three: a fetch must learn what
// is held (Stat), resume what was begun (Partials), read a collection it
// completed (Collection) and write verified slices (OpenPartial).
type Store interface {
	// Stat returns what is known of c, or an error wrapping
	// cas.ErrNotFound. Safe for concurrent use.
	Stat(c cas.CID) (cas.Info, error)
	// Partials returns the sizes of the downloads in progress, by raw
	// CID. Safe for concurrent use.
	Partials() (map[cas.CID]int64, error)
	// Collection reads and parses the stored collection c (a collection
	// CID). Safe for concurrent use.
	Collection(c cas.CID) (*cas.Collection, error)
	// OpenPartial opens (or resumes) the download of c, a blob of size
	// bytes whose size was proven. Several opens of one blob share its
	// progress; each is matched by Close or Finish. Safe for concurrent
	// use.
	OpenPartial(c cas.CID, size int64) (Partial, error)
}

// Partial is a blob being downloaded into a Store. Safe for concurrent use.
type Partial interface {
	// WriteSlice verifies slice, the bao slice of [off, off+n), against
	// the blob's CID and keeps its groups; on a bad group it returns a
	// *cas.RangeError naming it and keeps nothing of the slice. slice is
	// not kept.
	WriteSlice(off, n int64, slice []byte) error
	// Missing returns the group-aligned ranges not yet verified, in order
	// (one empty range for an empty blob not yet written).
	Missing() []cas.Range
	// Finish stores the blob once every group is verified, and releases
	// the Partial.
	Finish(ctx context.Context) (cas.Info, error)
	// Close releases the Partial, keeping its progress.
	Close() error
}
