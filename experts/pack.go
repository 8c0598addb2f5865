package experts

import "fmt"

// Packer lays tensors out in shards of at most ShardSize bytes, in the
// order they are placed: a tensor or a group (an expert) that fits a shard
// never crosses a shard's end; a larger one starts a shard and continues
// into the next ones. Shards are laid end to end, so consecutive placements
// are contiguous in the model's byte space.
type Packer struct {
	shards []int64 // sizes; the last is the one being filled
}

// Place reserves size bytes and returns where they start.
func (p *Packer) Place(size int64) (shard int, offset int64) {
	if len(p.shards) == 0 {
		p.shards = append(p.shards, 0)
	}
	last := len(p.shards) - 1
	if at := p.shards[last]; at > 0 && at+size > ShardSize {
		p.shards = append(p.shards, 0)
		last++
	}
	shard, offset = last, p.shards[last]
	for left := size; left > 0; {
		n := min(left, ShardSize-p.shards[last])
		p.shards[last] += n
		left -= n
		if p.shards[last] == ShardSize && left > 0 {
			p.shards = append(p.shards, 0)
			last++
		}
	}
	return shard, offset
}

// Group starts a new shard unless size more bytes fit in the current one:
// call it before placing the members of a group that must stay together.
func (p *Packer) Group(size int64) {
	if n := len(p.shards); n > 0 && p.shards[n-1] > 0 && p.shards[n-1]+size > ShardSize {
		p.shards = append(p.shards, 0)
	}
}

// Shards returns the shard sizes, named shard-00000.bin and on, with no
// hashes yet; TotalSize is their sum.
func (p *Packer) Shards() (shards []ShardInfo, total int64) {
	for i, s := range p.shards {
		if s == 0 {
			continue // an empty last shard
		}
		shards = append(shards, ShardInfo{Filename: fmt.Sprintf("shard-%05d.bin", i), Size: s})
		total += s
	}
	return shards, total
}
