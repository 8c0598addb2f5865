package tiers

import "fmt"

// Where VRAM entries go in the arena.
//
// A GPU arena is several buffers (a storage binding holds at most 2 GiB),
// and a kernel that reads several matrices in one dispatch (an MoE layer's
// masked expert products) reads them from one buffer: a layer whose
// matrices lie in two buffers takes two dispatches, each paying a
// dispatch's fixed cost (on the H100, resident Mixtral with gate and up
// split 11 + 5 over two buffers: 72 + 54 us against 88 us for one). So
// keys that a kernel reads together can be declared a group (Cache.Group),
// and the VRAM level keeps a group in one bank when it can: a group's
// first key picks the bank with the least room that still holds the whole
// group (best fit, so that large free banks stay for large groups), and
// reserves that room for the group's other keys. Reservations are soft:
// when no bank has unreserved room, a key takes a reserved slot, and a
// group whose bank is full moves on to another one.

// BankedArena is an Arena whose slots come in banks of BankSlots
// consecutive slots (GPUArena: one GPU buffer a bank).
type BankedArena interface {
	Arena
	BankSlots() int
}

// placer hands out VRAM slots. Guarded by the cache's lock.
type placer struct {
	bankSlots int
	free      [][]int // per bank, a stack: the lowest free slot on top
	nfree     int
	reserved  []int // per bank: free slots promised to groups
	groupOf   map[int]int
	groups    []placeGroup
}

type placeGroup struct {
	size     int // keys in the group
	placed   int // of them in VRAM
	home     int // its bank (-1: none yet)
	reserved int // slots it holds reserved in home
}

func newPlacer(a Arena) *placer {
	slots := a.Slots()
	bank := slots
	if b, ok := a.(BankedArena); ok && b.BankSlots() > 0 {
		bank = b.BankSlots()
	}
	banks := (slots + bank - 1) / max(bank, 1)
	p := &placer{bankSlots: max(bank, 1), free: make([][]int, banks), reserved: make([]int, banks), groupOf: map[int]int{}}
	for s := slots - 1; s >= 0; s-- {
		p.free[s/p.bankSlots] = append(p.free[s/p.bankSlots], s)
	}
	p.nfree = slots
	return p
}

// group declares ids read together (ids already in a group move to this
// one; their placed count stays with the old group).
func (p *placer) group(ids []int) {
	g := len(p.groups)
	p.groups = append(p.groups, placeGroup{size: len(ids), home: -1})
	for _, id := range ids {
		p.groupOf[id] = g
	}
}

// avail is bank b's free slots not promised to a group.
func (p *placer) avail(b int) int { return max(0, len(p.free[b])-p.reserved[b]) }

// fit returns the bank with the least unreserved room that still holds
// need slots, else the one with the most unreserved room, else the one
// with the most free slots (taking reserved ones); -1 if none is free.
func (p *placer) fit(need int) int {
	best, most, any := -1, -1, -1
	for b := range p.free {
		a := p.avail(b)
		if a >= need && (best < 0 || a < p.avail(best)) {
			best = b
		}
		if a > 0 && (most < 0 || a > p.avail(most)) {
			most = b
		}
		if len(p.free[b]) > 0 && (any < 0 || len(p.free[b]) > len(p.free[any])) {
			any = b
		}
	}
	switch {
	case best >= 0:
		return best
	case most >= 0:
		return most
	}
	return any
}

// take returns a free slot for id. Callers check that one is free.
func (p *placer) take(id int) int {
	b := -1
	if g, ok := p.groupOf[id]; ok {
		gr := &p.groups[g]
		if gr.home < 0 || len(p.free[gr.home]) == 0 {
			if gr.home >= 0 {
				p.reserved[gr.home] -= gr.reserved
				gr.reserved = 0
			}
			need := max(1, gr.size-gr.placed)
			gr.home = p.fit(need)
			gr.reserved = min(need, p.avail(gr.home))
			p.reserved[gr.home] += gr.reserved
		}
		b = gr.home
		if gr.reserved > 0 {
			gr.reserved--
			p.reserved[b]--
		}
		gr.placed++
	} else {
		b = p.fit(1)
	}
	f := p.free[b]
	s := f[len(f)-1]
	p.free[b] = f[:len(f)-1]
	p.nfree--
	return s
}

// put frees id's slot s; a group's slot in its home stays reserved for it.
func (p *placer) put(id, s int) {
	b := s / p.bankSlots
	p.free[b] = append(p.free[b], s)
	p.nfree++
	if g, ok := p.groupOf[id]; ok {
		gr := &p.groups[g]
		gr.placed--
		if b == gr.home {
			gr.reserved++
			p.reserved[b]++
		}
	}
}

// check verifies the placer against the slots in use (for Cache.check):
// every slot is used or free once, reservations match the groups'.
func (p *placer) check(used map[int]bool, slots int) error {
	seen := map[int]bool{}
	n := 0
	for b, f := range p.free {
		for _, s := range f {
			if s/p.bankSlots != b || used[s] || seen[s] || s < 0 || s >= slots {
				return fmt.Errorf("vram: free slot %d (bank %d) is used, repeated or out of place", s, b)
			}
			seen[s] = true
			n++
		}
	}
	if n != p.nfree || len(used)+n != slots {
		return fmt.Errorf("vram: %d slots used + %d free (counted %d) != %d", len(used), n, p.nfree, slots)
	}
	res := make([]int, len(p.free))
	for _, g := range p.groups {
		if g.reserved < 0 || (g.reserved > 0 && g.home < 0) {
			return fmt.Errorf("vram: group %+v", g)
		}
		if g.home >= 0 {
			res[g.home] += g.reserved
		}
	}
	for b := range res {
		if res[b] != p.reserved[b] {
			return fmt.Errorf("vram: bank %d: %d slots reserved; the groups hold %d", b, p.reserved[b], res[b])
		}
	}
	return nil
}
