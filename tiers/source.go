package tiers

import (
	"context"
	"fmt"
	"io"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
)

// DiskSource is the disk level: the cas store, which verifies every group
// it reads against the blob's CID.
type DiskSource struct{ Store *cas.Store }

// Has reports whether the store holds the whole blob.
func (d DiskSource) Has(k Key) bool { return d.Store.Has(k.Blob) }

// diskPart is the least a verified read gives one goroutine.
const diskPart = 4 << 20

// Read reads k from the store, verified. A large key is read in parts
// (whole 16 KiB groups each) by up to GOMAXPROCS goroutines: one core
// verifies about 2.8 GB/s, less than a page-cache or NVMe read.
func (d DiskSource) Read(ctx context.Context, k Key, dst []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := d.Store.Open(k.Blob)
	if err != nil {
		return err
	}
	defer r.Close()
	parts := min(int64(runtime.GOMAXPROCS(0)), k.Len/diskPart)
	if parts <= 1 {
		return readFull(r, dst[:k.Len], k.Off)
	}
	r.WillNeed(k.Off, k.Len) // one readahead of the whole key, not one per part
	part := (k.Len/parts + bao.GroupSize - 1) / bao.GroupSize * bao.GroupSize
	g, _ := errgroup.WithContext(ctx)
	for lo := int64(0); lo < k.Len; lo += part {
		hi := min(lo+part, k.Len)
		g.Go(func() error { return readFull(r, dst[lo:hi], k.Off+lo) })
	}
	return g.Wait()
}

func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if err == io.EOF && n == len(p) {
		err = nil
	}
	return err
}

// SliceFetcher fetches the bao slice encoding of a byte range of a blob
// from the swarm (swarm.Ranges). The bytes are untrusted: the swarm level
// verifies them against the CID itself.
type SliceFetcher interface {
	// FetchSlice returns the bao slice of [off, off+n) of blob c of size
	// bytes: whole 16 KiB groups (off a multiple of 16 KiB, n too unless
	// the range ends the blob), at most MaxSlice bytes. Safe for
	// concurrent use; ctx cancels the fetch.
	FetchSlice(ctx context.Context, c cas.CID, size, off, n int64) ([]byte, error)
}

// MaxSlice is the most bytes SwarmSource asks of one FetchSlice (the wire
// protocol's largest request).
const MaxSlice = 4 << 20

// swarmParallel bounds the slices of one key in flight at once.
const swarmParallel = 4

// SwarmSource is the swarm level: ranges fetched from peers, each verified
// against the blob's CID with its bao proof before a byte is used.
type SwarmSource struct{ Fetcher SliceFetcher }

// Has is true: the swarm is the last resort.
func (s SwarmSource) Has(Key) bool { return true }

// Read fetches the groups that cover k, in slices of at most MaxSlice
// bytes (up to swarmParallel at once), and verifies each. A slice that
// fails verification is an error wrapping cas.ErrCorrupt; dst is then left
// cleared.
func (s SwarmSource) Read(ctx context.Context, k Key, dst []byte) error {
	start, end := bao.Cover(k.Size, k.Off, k.Len)
	cover := make([]byte, end-start)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(swarmParallel)
	for lo := start; lo < end; lo += MaxSlice {
		n := min(MaxSlice, end-lo)
		g.Go(func() error {
			slice, err := s.Fetcher.FetchSlice(gctx, k.Blob, k.Size, lo, n)
			if err != nil {
				return err
			}
			var scratch [bao.GroupSize]byte
			if err := bao.DecodeSlice(cover[lo-start:lo-start+n], slice, k.Blob.Digest(), k.Size, lo, n, &scratch); err != nil {
				return fmt.Errorf("%w: swarm slice [%d, +%d) of %v: %v", cas.ErrCorrupt, lo, n, k, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		clear(dst)
		return err
	}
	copy(dst, cover[k.Off-start:k.Off-start+k.Len])
	return nil
}

// LimitFetcher bounds the FetchSlice calls of f in flight at once to n:
// a peer answers "busy" past its own bound on outstanding requests
// (swarm.Config.MaxRequests, 32 by default), and a pager that pages many
// matrices at once, each in several slices, would pass it.
func LimitFetcher(f SliceFetcher, n int) SliceFetcher {
	return &limitFetcher{f: f, sem: make(chan struct{}, max(n, 1))}
}

type limitFetcher struct {
	f   SliceFetcher
	sem chan struct{}
}

func (l *limitFetcher) FetchSlice(ctx context.Context, c cas.CID, size, off, n int64) ([]byte, error) {
	select {
	case l.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-l.sem }()
	return l.f.FetchSlice(ctx, c, size, off, n)
}
