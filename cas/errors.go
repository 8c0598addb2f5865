package cas

import (
	"errors"
	"fmt"
)

var (
	// ErrBadCID: a string is not a CID this store understands.
	ErrBadCID = errors.New("malformed CID")
	// ErrNotFound: the blob is not in the store.
	ErrNotFound = errors.New("blob not found")
	// ErrCorrupt: bytes do not hash to what their CID promises.
	ErrCorrupt = errors.New("corrupt data")
	// ErrClosed: the store or partial blob was closed.
	ErrClosed = errors.New("store closed")
	// ErrLocked: another process holds the store's index.
	ErrLocked = errors.New("store is locked by another process")
	// ErrNotCollection: the blob is not a collection.
	ErrNotCollection = errors.New("not a collection")
)

// RangeError says which bytes of which blob failed verification. It wraps
// ErrCorrupt.
type RangeError struct {
	CID      CID
	Off, Len int64
	Reason   string
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("blob %s bytes [%d, %d): %s: %v", e.CID, e.Off, e.Off+e.Len, e.Reason, ErrCorrupt)
}

func (e *RangeError) Unwrap() error { return ErrCorrupt }

// notFound wraps ErrNotFound with the CID.
func notFound(c CID) error { return fmt.Errorf("%w: %s", ErrNotFound, c) }
