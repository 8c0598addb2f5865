package tiers

import (
	"context"
	"testing"
)

// bankedArena is a memArena in banks of bank slots.
type bankedArena struct {
	*memArena
	bank int
}

func (a bankedArena) BankSlots() int { return a.bank }

// Groups loaded interleaved (one key of each in turn, as parallel loads
// arrive) each end up in one bank: 6 groups of 6 keys in 3 banks of 12
// slots. Handed out in arrival order, as before placement, every group
// would straddle banks.
func TestGroupsStayInOneBank(t *testing.T) {
	w := newWorld(t, 36)
	mem := newMemArena(36, keyLen)
	c, err := New(Config{Arena: bankedArena{mem, 12}, Disk: DiskSource{w.st}, Now: fakeNow()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const groups, size = 6, 6
	for g := range groups {
		c.Group(w.keys[g*size : (g+1)*size])
	}
	slot := map[Key]int{}
	for i := range size {
		for g := range groups {
			k := w.keys[g*size+i]
			l, err := c.Get(context.Background(), k, VRAM)
			if err != nil {
				t.Fatal(err)
			}
			slot[k] = l.Slot()
			l.Release()
			if err := c.check(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for g := range groups {
		bank := slot[w.keys[g*size]] / 12
		for _, k := range w.keys[g*size : (g+1)*size] {
			if slot[k]/12 != bank {
				t.Fatalf("group %d: key at slot %d, bank %d; the group's first key is in bank %d (slots %v)", g, slot[k], slot[k]/12, bank, slot)
			}
		}
	}
}
