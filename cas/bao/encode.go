package bao

import (
	"encoding/binary"

	"lukechampine.com/blake3/guts"
)

// Encoder computes the BLAKE3 root and the outboard of a stream in one pass.
// Write whole groups (multiples of GroupSize) where you can: they are hashed
// straight from the caller's buffer. The zero value is ready to use; an
// Encoder is not safe for concurrent use.
type Encoder struct {
	cvs     [][8]uint32 // chaining value of every completed group
	first   guts.Node   // node of group 0, kept in case it is the root
	pending [GroupSize]byte
	n       int   // bytes in pending
	size    int64 // bytes written
	scratch [GroupSize]byte
}

// Reset forgets everything written, keeping allocated memory.
func (e *Encoder) Reset() {
	e.cvs = e.cvs[:0]
	e.n = 0
	e.size = 0
}

// Size returns the number of bytes written so far.
func (e *Encoder) Size() int64 { return e.size }

// Write hashes p. It never fails and does not keep p.
func (e *Encoder) Write(p []byte) (int, error) {
	total := len(p)
	e.size += int64(total)
	if e.n > 0 {
		c := copy(e.pending[e.n:], p)
		e.n += c
		p = p[c:]
		if e.n < GroupSize {
			return total, nil
		}
		e.addGroup(e.pending[:])
		e.n = 0
	}
	for len(p) >= GroupSize {
		e.addGroup(p[:GroupSize])
		p = p[GroupSize:]
	}
	e.n = copy(e.pending[:], p)
	return total, nil
}

func (e *Encoder) addGroup(g []byte) {
	n := groupNode(g, int64(len(e.cvs)), &e.scratch)
	if len(e.cvs) == 0 {
		e.first = n
	}
	e.cvs = append(e.cvs, guts.ChainingValue(n))
}

// Sum returns the BLAKE3 root of everything written and appends its
// outboard to ob. It does not change the Encoder's state beyond finishing
// the last partial group, so Sum must be the last call before Reset.
func (e *Encoder) Sum(ob []byte) (root [32]byte, outboard []byte) {
	if e.n > 0 || len(e.cvs) == 0 {
		e.addGroup(e.pending[:e.n])
		e.n = 0
	}
	k := int64(len(e.cvs))
	base := len(ob)
	ob = append(ob, make([]byte, OutboardSize(e.size))...)
	binary.LittleEndian.PutUint64(ob[base:], uint64(e.size))
	nodes := ob[base+HeaderSize:]

	var rec func(lo, k int64, at int64, flags uint32) [8]uint32
	rec = func(lo, k int64, at int64, flags uint32) [8]uint32 {
		if k == 1 {
			return e.cvs[lo]
		}
		p := leftGroups(k)
		l := rec(lo, p, at+NodeSize, 0)
		r := rec(lo+p, k-p, at+NodeSize*p, 0)
		putCV(nodes[at:], &l)
		putCV(nodes[at+32:], &r)
		return parentCV(l, r, flags)
	}
	var cv [8]uint32
	if k == 1 {
		cv = nodeCV(e.first, guts.FlagRoot)
	} else {
		cv = rec(0, k, 0, guts.FlagRoot)
	}
	putCV(root[:], &cv)
	return root, ob
}

// Sum256 returns the BLAKE3-256 hash of p (the root of its tree).
func Sum256(p []byte) [32]byte {
	var e Encoder
	e.Write(p)
	root, _ := e.Sum(nil)
	return root
}
