package bao

import (
	"encoding/binary"
	"fmt"
	"slices"

	"lukechampine.com/blake3/guts"
)

// Error says which bytes of a blob failed verification and why. Off and Len
// name the smallest range the failure can be pinned to: one group when a
// group's data is wrong, a subtree when a tree node is, the requested range
// when the encoding itself is malformed.
type Error struct {
	Off, Len int64
	Reason   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("bytes [%d, %d): %s", e.Off, e.Off+e.Len, e.Reason)
}

func checkRange(size, off, n int64) error {
	if off < 0 || n < 0 || off+n > size || off+n < off {
		return &Error{Off: off, Len: n, Reason: fmt.Sprintf("range outside blob of %d bytes", size)}
	}
	return nil
}

// verifier walks the tree of a blob of size bytes for the range [off, off+n),
// checking every node and group it visits against the chaining value that
// its parent (or the root) promises.
type verifier struct {
	size, off, n int64
	scratch      *[GroupSize]byte
}

func (v *verifier) groupLen(g int64) int64 {
	return min(GroupSize, v.size-g*GroupSize)
}

func (v *verifier) fail(lo, k int64, reason string) *Error {
	end := min((lo+k)*GroupSize, v.size)
	return &Error{Off: lo * GroupSize, Len: end - lo*GroupSize, Reason: reason}
}

// VerifyCover checks cover, the bytes of the groups covering [off, off+n)
// (see Cover), against root using the blob's outboard. It reads only the
// outboard nodes on the paths to those groups.
func VerifyCover(root [32]byte, outboard, cover []byte, size, off, n int64, scratch *[GroupSize]byte) error {
	if err := checkRange(size, off, n); err != nil {
		return err
	}
	if int64(len(outboard)) != OutboardSize(size) || binary.LittleEndian.Uint64(outboard) != uint64(size) {
		return &Error{Off: 0, Len: size, Reason: "outboard does not match blob size"}
	}
	start, end := Cover(size, off, n)
	if n == 0 {
		start, end = 0, min(size, GroupSize) // an empty range still proves the root
		off, n = 0, 1
	}
	if int64(len(cover)) != end-start {
		return &Error{Off: start, Len: end - start, Reason: fmt.Sprintf("cover is %d bytes; want %d", len(cover), end-start)}
	}
	v := verifier{size: size, off: off, n: n, scratch: scratch}
	nodes := outboard[HeaderSize:]
	var rec func(cv [8]uint32, lo, k, at int64, flags uint32) error
	rec = func(cv [8]uint32, lo, k, at int64, flags uint32) error {
		if !intersects(lo, k, v.off, v.n) && size > 0 {
			return nil
		}
		if k == 1 {
			b := lo*GroupSize - start
			g := cover[b : b+v.groupLen(lo)]
			if nodeCV(groupNode(g, lo, scratch), flags) != cv {
				return v.fail(lo, 1, "group hash mismatch")
			}
			return nil
		}
		node := nodes[at : at+NodeSize]
		l, r := cvFromBytes(node[:32]), cvFromBytes(node[32:])
		if parentCV(l, r, flags) != cv {
			return v.fail(lo, k, "outboard node hash mismatch")
		}
		p := leftGroups(k)
		if err := rec(l, lo, p, at+NodeSize, 0); err != nil {
			return err
		}
		return rec(r, lo+p, k-p, at+NodeSize*p, 0)
	}
	return rec(cvFromBytes(root[:]), 0, Groups(size), 0, guts.FlagRoot)
}

// AppendSlice appends to dst the slice encoding of [off, off+n), built from
// the blob's outboard and cover (the bytes of the covering groups). It does
// not verify; call VerifyCover first when the inputs come from a disk.
func AppendSlice(dst, outboard, cover []byte, size, off, n int64) ([]byte, error) {
	if err := checkRange(size, off, n); err != nil {
		return dst, err
	}
	start, end := Cover(size, off, n)
	if int64(len(cover)) != end-start && n > 0 {
		return dst, &Error{Off: start, Len: end - start, Reason: "short cover"}
	}
	dst = binary.LittleEndian.AppendUint64(dst, uint64(size))
	if n == 0 {
		return dst, nil
	}
	nodes := outboard[HeaderSize:]
	var rec func(lo, k, at int64)
	rec = func(lo, k, at int64) {
		if !intersects(lo, k, off, n) {
			return
		}
		if k == 1 {
			b := lo*GroupSize - start
			dst = append(dst, cover[b:b+min(GroupSize, size-lo*GroupSize)]...)
			return
		}
		dst = append(dst, nodes[at:at+NodeSize]...)
		p := leftGroups(k)
		rec(lo, p, at+NodeSize)
		rec(lo+p, k-p, at+NodeSize*p)
	}
	rec(0, Groups(size), 0)
	return dst, nil
}

// AppendSliceAt is AppendSlice with the data read straight into dst: the
// tree nodes come from outboard, and each run of consecutive covering
// groups is read by one call of readAt (whose p is dst's room for the
// run and off the run's offset in the blob; it must fill p or fail), so
// the data is copied once, from its source into the slice. Like
// AppendSlice it does not verify: it is for a reader whose receiver
// verifies the slice. On an error from readAt dst is returned as it was.
func AppendSliceAt(dst, outboard []byte, size, off, n int64, readAt func(p []byte, off int64) error) ([]byte, error) {
	if err := checkRange(size, off, n); err != nil {
		return dst, err
	}
	if int64(len(outboard)) != OutboardSize(size) {
		return dst, &Error{Off: 0, Len: size, Reason: "outboard does not match blob size"}
	}
	orig := len(dst)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(size))
	if n == 0 {
		return dst, nil
	}
	dst = slices.Grow(dst, int(SliceLen(size, off, n))-HeaderSize)
	nodes := outboard[HeaderSize:]
	// The pending run of groups [runOff, runOff+runLen), placed at the
	// end of dst once it is read.
	var runOff, runLen int64
	var err error
	flush := func() {
		if runLen == 0 || err != nil {
			return
		}
		at := len(dst)
		dst = dst[:at+int(runLen)]
		err = readAt(dst[at:], runOff)
		runLen = 0
	}
	var rec func(lo, k, at int64)
	rec = func(lo, k, at int64) {
		if !intersects(lo, k, off, n) || err != nil {
			return
		}
		if k == 1 {
			if runLen == 0 {
				runOff = lo * GroupSize
			}
			runLen += min(GroupSize, size-lo*GroupSize)
			return
		}
		flush()
		dst = append(dst, nodes[at:at+NodeSize]...)
		p := leftGroups(k)
		rec(lo, p, at+NodeSize)
		rec(lo+p, k-p, at+NodeSize*p)
	}
	rec(0, Groups(size), 0)
	flush()
	if err != nil {
		return dst[:orig], err
	}
	return dst, nil
}

// DecodeSlice verifies a slice encoding of [off, off+n) against root and
// size, and copies the data of the covering groups into dst, which must hold
// at least end-start bytes (see Cover). Nothing is copied past the first
// failure, and dst must not be trusted unless the error is nil.
func DecodeSlice(dst, slice []byte, root [32]byte, size, off, n int64, scratch *[GroupSize]byte) error {
	start, end := Cover(size, off, n)
	if n > 0 && int64(len(dst)) < end-start && checkRange(size, off, n) == nil {
		return &Error{Off: start, Len: end - start, Reason: "destination too small"}
	}
	return VerifySlice(slice, root, size, off, n, scratch, func(g []byte, at int64) {
		copy(dst[at-start:], g)
	})
}

// VerifySlice verifies a slice encoding of [off, off+n) against root and
// size in place. group, if not nil, is called with each covering group's
// data (a part of slice) and its offset in the blob, in order, once the
// group has verified; the groups must not be trusted unless VerifySlice
// returns nil (a later one may fail).
func VerifySlice(slice []byte, root [32]byte, size, off, n int64, scratch *[GroupSize]byte, group func(data []byte, off int64)) error {
	if err := checkRange(size, off, n); err != nil {
		return err
	}
	if n == 0 {
		return &Error{Off: off, Len: n, Reason: "empty range proves nothing"}
	}
	if len(slice) < HeaderSize || binary.LittleEndian.Uint64(slice) != uint64(size) {
		return &Error{Off: off, Len: n, Reason: "slice header does not match blob size"}
	}
	if want := SliceLen(size, off, n); int64(len(slice)) != want {
		return &Error{Off: off, Len: n, Reason: fmt.Sprintf("slice is %d bytes; want %d", len(slice), want)}
	}
	v := verifier{size: size, off: off, n: n, scratch: scratch}
	pos := HeaderSize
	var rec func(cv [8]uint32, lo, k int64, flags uint32) error
	rec = func(cv [8]uint32, lo, k int64, flags uint32) error {
		if !intersects(lo, k, off, n) {
			return nil
		}
		if k == 1 {
			gl := int(v.groupLen(lo))
			g := slice[pos : pos+gl]
			pos += gl
			if nodeCV(groupNode(g, lo, scratch), flags) != cv {
				return v.fail(lo, 1, "group hash mismatch")
			}
			if group != nil {
				group(g, lo*GroupSize)
			}
			return nil
		}
		node := slice[pos : pos+NodeSize]
		pos += NodeSize
		l, r := cvFromBytes(node[:32]), cvFromBytes(node[32:])
		if parentCV(l, r, flags) != cv {
			return v.fail(lo, k, "tree node hash mismatch")
		}
		p := leftGroups(k)
		if err := rec(l, lo, p, 0); err != nil {
			return err
		}
		return rec(r, lo+p, k-p, 0)
	}
	return rec(cvFromBytes(root[:]), 0, Groups(size), guts.FlagRoot)
}

// CopySliceNodes copies the tree nodes carried by a slice of [off, off+n)
// to their places in ob, an outboard buffer of OutboardSize(size) bytes, so
// that a download assembles the blob's outboard from its proofs. Call it
// only with a slice that DecodeSlice accepted.
func CopySliceNodes(ob, slice []byte, size, off, n int64) {
	binary.LittleEndian.PutUint64(ob, uint64(size))
	nodes := ob[HeaderSize:]
	pos := int64(HeaderSize)
	var rec func(lo, k, at int64)
	rec = func(lo, k, at int64) {
		if !intersects(lo, k, off, n) {
			return
		}
		if k == 1 {
			pos += min(GroupSize, size-lo*GroupSize)
			return
		}
		copy(nodes[at:at+NodeSize], slice[pos:pos+NodeSize])
		pos += NodeSize
		p := leftGroups(k)
		rec(lo, p, at+NodeSize)
		rec(lo+p, k-p, at+NodeSize*p)
	}
	rec(0, Groups(size), 0)
}

// VerifyTree checks every parent node of an outboard against root, top
// down. It proves the outboard, not the data: each group must still be
// checked against the chaining value its parent holds (VerifyCover).
func VerifyTree(root [32]byte, outboard []byte, size int64) error {
	if int64(len(outboard)) != OutboardSize(size) || binary.LittleEndian.Uint64(outboard) != uint64(size) {
		return &Error{Off: 0, Len: size, Reason: "outboard does not match blob size"}
	}
	k := Groups(size)
	if k == 1 {
		return nil // no parents: the root is the group's own hash
	}
	v := verifier{size: size}
	nodes := outboard[HeaderSize:]
	var rec func(cv [8]uint32, lo, k, at int64, flags uint32) error
	rec = func(cv [8]uint32, lo, k, at int64, flags uint32) error {
		if k == 1 {
			return nil
		}
		node := nodes[at : at+NodeSize]
		l, r := cvFromBytes(node[:32]), cvFromBytes(node[32:])
		if parentCV(l, r, flags) != cv {
			return v.fail(lo, k, "outboard node hash mismatch")
		}
		p := leftGroups(k)
		if err := rec(l, lo, p, at+NodeSize, 0); err != nil {
			return err
		}
		return rec(r, lo+p, k-p, at+NodeSize*p, 0)
	}
	return rec(cvFromBytes(root[:]), 0, k, 0, guts.FlagRoot)
}
