package ops

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/rdrr/peer/gpu"
)

// L2Prefetch reads the first word of every 32-byte sector of its region
// and no other, and a thread writes its sink only when its words xor to
// l2PrefetchKey. With every sector's first word zero but one sector's,
// l2PrefetchKey: the sink is written (that sector was read, by a thread
// that read no other nonzero word); with that word one off the key, it
// is not. The probed sectors are the first and last, and those at the
// edges of a thread's rounds.
func TestL2Prefetch(t *testing.T) {
	d, k := shared.d, shared.k
	r := rng(t)
	const key = l2PrefetchKey
	// Sizes: one word, part of a sector, a few workgroups, past the
	// threads' first round of 8 sectors and second, a ragged end.
	for _, n := range []int{4, 100, 32 * 256 * 3, l2PrefetchThreads*32*8 + 32*300 + 12} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			sectors := (n + 31) / 32
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			for s := range sectors {
				binary.LittleEndian.PutUint32(data[32*s:], 0)
			}
			region, err := d.Alloc(uint64(n))
			if err != nil {
				t.Fatal(err)
			}
			defer region.Release()
			if err := d.Write(region, data); err != nil {
				t.Fatal(err)
			}
			l, err := L2PrefetchLaunch(uint64(n))
			if err != nil {
				t.Fatal(err)
			}
			threads := int(l.Groups[0]) * 256
			word := func(s int, v uint32) {
				if err := d.Write(region.Sub(uint64(32*s), 4), binary.LittleEndian.AppendUint32(nil, v)); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range []int{0, 1, sectors - 1, threads - 1, threads, 8*threads - 1, 8 * threads, 9 * threads, sectors / 2} {
				if s < 0 || s >= sectors {
					continue
				}
				for _, v := range []uint32{key, key ^ 1} {
					word(s, v)
					sink := poisoned(t, d, 4)
					before := readU32(t, d, sink, 1)[0]
					run(t, d, func(bt *gpu.Batch) error { return k.L2Prefetch(ctxT(t), bt, region, sink) })
					got := readU32(t, d, sink, 1)[0]
					switch {
					case v == key && got != key:
						t.Fatalf("sector %d of %d (%d threads): sink %#x; want %#x", s, sectors, threads, got, uint32(key))
					case v != key && got != before:
						t.Fatalf("sector %d holding the key one off: sink written (%#x)", s, got)
					}
				}
				word(s, 0)
			}
		})
	}
	for _, n := range []uint64{0, 6} {
		if _, err := L2PrefetchLaunch(n); !errors.Is(err, gpu.ErrShape) {
			t.Errorf("L2PrefetchLaunch(%d): %v; want gpu.ErrShape", n, err)
		}
	}
}
