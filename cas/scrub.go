//go:build !js

package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/rdrr/peer/cas/bao"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/time/rate"
)

// ScrubOptions bounds a scrub.
type ScrubOptions struct {
	// Rate limits reading in bytes per second; zero means no limit.
	Rate int64
	// Progress, if set, is called after each blob.
	Progress func(done, total int64, c CID, err error)
}

// BadBlob is a blob that scrub found wrong.
type BadBlob struct {
	CID    CID    `json:"cid"`
	Reason string `json:"reason"`
}

// ScrubReport says what a scrub checked and found.
type ScrubReport struct {
	Blobs    int64     `json:"blobs"`
	Bytes    int64     `json:"bytes"`
	Bad      []BadBlob `json:"bad"`
	Repaired []CID     `json:"repaired_outboards,omitempty"`
}

// Scrub re-hashes every stored blob. A blob whose data does not hash to its
// CID is marked corrupt (never served again; a later Put or fetch of the
// same CID replaces it) and reported. A good blob whose outboard file is
// damaged gets its outboard rewritten. Reads are limited to opt.Rate.
func (s *Store) Scrub(ctx context.Context, opt ScrubOptions) (ScrubReport, error) {
	var rep ScrubReport
	type entry struct {
		c    CID
		size int64
	}
	var all []entry
	var total int64
	seen := map[Digest]bool{} // List may name a blob by both its CIDs
	err := s.List(func(inf Info) error {
		if seen[inf.CID.Digest()] {
			return nil
		}
		seen[inf.CID.Digest()] = true
		all = append(all, entry{inf.CID, inf.Size})
		total += inf.Size
		return nil
	})
	if err != nil {
		return rep, err
	}
	var lim *rate.Limiter
	if opt.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(opt.Rate), int(min(opt.Rate, putBufSize)))
	}
	buf := make([]byte, putBufSize)
	var enc bao.Encoder
	for _, e := range all {
		err := s.scrubOne(ctx, e.c, e.size, &enc, buf, lim, &rep)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return rep, err
		}
		var re *RangeError
		if errors.As(err, &re) {
			rep.Bad = append(rep.Bad, BadBlob{CID: e.c, Reason: re.Reason})
			if merr := s.markCorrupt(e.c); merr != nil {
				return rep, merr
			}
		} else if err != nil {
			return rep, err
		}
		rep.Blobs++
		if opt.Progress != nil {
			opt.Progress(rep.Bytes, total, e.c, err)
		}
	}
	return rep, nil
}

func (s *Store) scrubOne(ctx context.Context, c CID, size int64, enc *bao.Encoder, buf []byte, lim *rate.Limiter, rep *ScrubReport) error {
	f, err := os.Open(s.blobPath(c))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return &RangeError{CID: c, Len: size, Reason: "blob file missing"}
		}
		return err
	}
	defer f.Close()
	enc.Reset()
	for {
		if lim != nil {
			if err := lim.WaitN(ctx, len(buf)); err != nil {
				return err
			}
		} else if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(f, buf)
		enc.Write(buf[:n])
		rep.Bytes += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return fmt.Errorf("scrub %s: %w", c, err)
		}
	}
	if enc.Size() != size {
		return &RangeError{CID: c, Off: min(enc.Size(), size), Len: max(enc.Size(), size) - min(enc.Size(), size),
			Reason: fmt.Sprintf("blob file has %d bytes; want %d", enc.Size(), size)}
	}
	root, ob := enc.Sum(nil)
	if Digest(root) != c.Digest() {
		// Name the first bad group, using the outboard if it is intact.
		return s.locate(f, c, size)
	}
	s.obCache.Remove(c.Digest())
	if old, err := os.ReadFile(s.outboardPath(c)); err != nil || !bytes.Equal(old, ob) {
		if err := writeFileSync(s, s.outboardPath(c), ob); err != nil {
			return fmt.Errorf("scrub %s: rewrite outboard: %w", c, err)
		}
		rep.Repaired = append(rep.Repaired, c)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		r, ok, err := getRecord(tx, c)
		if err != nil || !ok {
			return err
		}
		r.Verified = s.opt.Now().UnixNano()
		r.Flags &^= flagCorrupt
		return putRecord(tx, c, &r)
	})
}

// locate finds the first bad range of a blob that failed its hash.
func (s *Store) locate(f *os.File, c CID, size int64) error {
	rd := &Reader{s: s, c: c, size: size, f: f}
	if _, err := rd.WriteTo(io.Discard); err != nil {
		return err
	}
	return &RangeError{CID: c, Len: size, Reason: "blob does not hash to its CID"}
}

func (s *Store) markCorrupt(c CID) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		r, ok, err := getRecord(tx, c)
		if err != nil || !ok {
			return err
		}
		r.Flags |= flagCorrupt
		return putRecord(tx, c, &r)
	})
}
