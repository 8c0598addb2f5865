package swarm

import (
	"math/rand/v2"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/swarm/wire"
)

// takeJob is a blob of n pieces of one HAVE unit each, all still to get,
// held by the providers of has: a nil bitmap for a whole copy, else the
// pieces listed.
func takeJob(n int, has map[peer.ID][]int) *blobJob {
	b := &blobJob{has: map[peer.ID]bool{}, bits: map[peer.ID][]byte{}}
	for i := range n {
		b.todo = append(b.todo, &piece{b: b, off: int64(i) * wire.PieceUnit, n: wire.PieceUnit})
	}
	for p, pieces := range has {
		b.has[p] = true
		if pieces == nil {
			continue
		}
		bm := make([]byte, (n+7)/8)
		for _, i := range pieces {
			bm[i/8] |= 1 << (i % 8)
		}
		b.bits[p] = bm
	}
	return b
}

func pieceIndex(pc *piece) int { return int(pc.off / wire.PieceUnit) }

// take hands a peer the rarest piece it holds: fewest providers first,
// ties at random (so that peers starting together fetch different
// pieces), and leaves a whole provider's pieces to partial providers
// with room.
func TestTakeRarestFirst(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	always := func(peer.ID) bool { return true }
	never := func(peer.ID) bool { return false }

	// Pieces 0-5. The seeder s has all; a has 0-4, b has 0-3, c has 0-1:
	// holders 4, 4, 3, 3, 2, 1. Asked of a peer that holds them all (s,
	// with no partial provider having room), the order of take is by
	// rarity: 5, then 4, then 2 and 3 in either order, then 0 and 1.
	has := map[peer.ID][]int{"s": nil, "a": {0, 1, 2, 3, 4}, "b": {0, 1, 2, 3}, "c": {0, 1}}
	b := takeJob(6, has)
	var got []int
	for {
		pc, _ := b.take("s", rng, true, never)
		if pc == nil {
			break
		}
		got = append(got, pieceIndex(pc))
	}
	if len(got) != 6 || got[0] != 5 || got[1] != 4 || got[2]+got[3] != 5 || got[4]+got[5] != 1 {
		t.Fatalf("pieces taken in the order %v; want 5, 4, then {2, 3}, then {0, 1}", got)
	}

	// A partial provider gets only what it has, rarest of those first.
	b = takeJob(6, has)
	pc, _ := b.take("b", rng, true, never)
	if pc == nil || pieceIndex(pc) != 2 && pieceIndex(pc) != 3 {
		t.Fatalf("b was handed %v; want piece 2 or 3 (held by 3, where 0 and 1 are held by 4)", pc)
	}

	// Ties go at random: among four pieces nobody but the seeder has,
	// the first taken is not always the same one.
	seen := map[int]bool{}
	for range 64 {
		b = takeJob(4, map[peer.ID][]int{"s": nil})
		pc, _ := b.take("s", rng, true, never)
		seen[pieceIndex(pc)] = true
	}
	if len(seen) < 3 {
		t.Fatalf("64 first takes among 4 equally rare pieces chose only %v", seen)
	}

	// A whole provider leaves to a partial provider with room the pieces
	// that one has: s is handed piece 5 (only s has it), and once that is
	// gone, nothing (left reports it was left pieces).
	b = takeJob(6, has)
	pc, left := b.take("s", rng, true, always)
	if pc == nil || pieceIndex(pc) != 5 {
		t.Fatalf("s was handed %v with partial providers that have room; want piece 5", pc)
	}
	if pc, left = b.take("s", rng, true, always); pc != nil || !left {
		t.Fatalf("s was handed %v (left %v); want nothing, the rest left to partial providers", pc, left)
	}
}
