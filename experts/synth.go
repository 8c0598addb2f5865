package experts

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/rdrr/peer/internal/atomicfile"
	"golang.org/x/sync/errgroup"
)

// A Preset is the shape of a synthetic model.
type Preset struct {
	Name   string
	Config Config
}

// Presets are the shapes `peer synth` makes. tiny-moe (Mixtral-style) and
// tiny-deepseek (a dense first layer, a shared expert, sigmoid
// group-limited routing) are small enough for a float64 CPU reference and
// lavapipe; the others have real shapes.
// DeepSeek-V3's multi-head latent attention is replaced by GQA of the
// same order of size (FORMAT.md says so).
var Presets = []Preset{
	{"tiny-moe", Config{
		ModelType: "mixtral", HiddenSize: 256, NumHiddenLayers: 4, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 64,
		IntermediateSize: 512, NumExperts: 8, NumExpertsPerTok: 2, VocabSize: 512, MaxPositions: 4096,
		RMSNormEps: 1e-5, RopeTheta: 10000,
	}},
	{"tiny-deepseek", Config{
		ModelType: "deepseek_v3", HiddenSize: 256, NumHiddenLayers: 4, NumAttentionHeads: 4, NumKeyValueHeads: 2, HeadDim: 64,
		IntermediateSize: 512, MoEIntermediateSize: 256, NumRoutedExperts: 16, NumSharedExperts: 1, NumExpertsPerTok: 4,
		FirstKDenseReplace: 1, ScoringFunc: "sigmoid", NGroup: 4, TopKGroup: 2, VocabSize: 512, MaxPositions: 4096,
		RMSNormEps: 1e-6, RopeTheta: 10000,
	}},
	{"mixtral-8x7b", Config{
		ModelType: "mixtral", HiddenSize: 4096, NumHiddenLayers: 32, NumAttentionHeads: 32, NumKeyValueHeads: 8, HeadDim: 128,
		IntermediateSize: 14336, NumExperts: 8, NumExpertsPerTok: 2, VocabSize: 32000, MaxPositions: 32768,
		RMSNormEps: 1e-5, RopeTheta: 1e6,
	}},
	{"deepseek-v3-671b", Config{
		ModelType: "deepseek_v3", HiddenSize: 7168, NumHiddenLayers: 61, NumAttentionHeads: 128, NumKeyValueHeads: 8, HeadDim: 128,
		IntermediateSize: 18432, MoEIntermediateSize: 2048, NumRoutedExperts: 256, NumSharedExperts: 1, NumExpertsPerTok: 8,
		FirstKDenseReplace: 3, ScoringFunc: "sigmoid", NGroup: 8, TopKGroup: 4, VocabSize: 129280, MaxPositions: 163840,
		RMSNormEps: 1e-6, RopeTheta: 10000,
	}},
}

// PresetByName returns the preset called name.
func PresetByName(name string) (Preset, error) {
	for _, p := range Presets {
		if p.Name == name {
			return p, nil
		}
	}
	names := make([]string, len(Presets))
	for i, p := range Presets {
		names[i] = p.Name
	}
	return Preset{}, fmt.Errorf("unknown preset %q (want one of %v)", name, names)
}

// Routing skew of synthetic models (FORMAT.md, "Synthetic models"). Each
// MoE layer ranks its experts by a fixed random permutation; the router
// row of the expert of rank r is
//
//	w_e = RouterBias * -ln(r+1) * u + RouterNoise * g_e
//
// where u is the unit all-ones direction and g_e a unit Gaussian
// direction. Every embedding row has a positive mean (EmbedDrift, in units
// of the row's standard deviation: 7.5/(11.5*4.61), see q4kBlock), so the residual stream leans along u
// and popular experts win more often (a Zipf-like skew, exponent set by
// RouterBias); tokens near in the sequence share their attention context,
// so their routes repeat (temporal locality).
const (
	RouterBias  = 4.0
	RouterNoise = 1.0
	EmbedDrift  = 7.5 / (11.5 * 4.61)
)

// placed is one tensor in the synthetic layout, in the order generated.
type placed struct {
	name  string
	id    uint64 // ordinal: seeds the tensor's bytes
	start int64  // first byte in the model's byte space
	t     *Tensor
	kind  tensorKind
	layer int
	rows  int64 // rows and cols of a matrix; cols is contiguous
	cols  int64
}

type tensorKind uint8

const (
	kindWeight tensorKind = iota // Q4_K, zero-mean, std 1/sqrt(cols)
	kindEmbed                    // Q4_K rows with a positive mean
	kindNorm                     // F32 near 1
	kindRouter                   // F32 rows with a popularity bias
)

// Layout is a synthetic model's plan: the manifest (hashes unset until
// Hash runs) and where each tensor's bytes come from.
type Layout struct {
	Manifest *Manifest
	seed     uint64
	placed   []placed
	byShard  [][]int // indexes into placed of the tensors in each shard
	ranks    [][]int // [layer][expert] popularity rank (0 the most popular)
}

// NewLayout lays out preset p with seed: dense tensors first, then each
// layer's experts, gate, up and down of one expert adjacent. No tensor or
// expert that fits in a shard crosses a shard's end; larger ones start a
// shard and fill the next ones. Shard hashes are left empty: Hash (or
// WriteModel) computes them.
func NewLayout(p Preset, seed uint64) (*Layout, error) {
	c := p.Config
	if err := c.validate(); err != nil {
		return nil, err
	}
	lo := &Layout{seed: seed, Manifest: &Manifest{
		ModelID: "synth/" + p.Name, Version: 1, Quantization: "Q4_K", HashAlgorithm: "blake3",
		Config: c, Tensors: map[string]*Tensor{}, Synth: &SynthInfo{Preset: p.Name, Seed: seed},
	}}
	var pk Packer
	add := func(name string, kind tensorKind, layer int, dt DType, rows, cols int64) *Tensor {
		shape := []int64{rows, cols}
		if rows == 1 {
			shape = []int64{cols}
		}
		size, _ := dt.Bytes(rows*cols, cols)
		t := &Tensor{Size: size, Shape: shape, DType: dt}
		t.Shard, t.Offset = pk.Place(size)
		lo.Manifest.Tensors[name] = t
		lo.placed = append(lo.placed, placed{name: name, id: uint64(len(lo.placed)), t: t, kind: kind, layer: layer, rows: rows, cols: cols})
		return t
	}
	h, hd := int64(c.HiddenSize), int64(c.HeadDimension())
	q, kv := int64(c.NumAttentionHeads)*hd, int64(c.NumKeyValueHeads)*hd
	add("model.embed_tokens.weight", kindEmbed, -1, Q4K, int64(c.VocabSize), h)
	for l := 0; l < c.NumHiddenLayers; l++ {
		pre := fmt.Sprintf("model.layers.%d.", l)
		add(pre+"input_layernorm.weight", kindNorm, l, F32, 1, h)
		add(pre+"self_attn.q_proj.weight", kindWeight, l, Q4K, q, h)
		add(pre+"self_attn.k_proj.weight", kindWeight, l, Q4K, kv, h)
		add(pre+"self_attn.v_proj.weight", kindWeight, l, Q4K, kv, h)
		add(pre+"self_attn.o_proj.weight", kindWeight, l, Q4K, h, q)
		add(pre+"post_attention_layernorm.weight", kindNorm, l, F32, 1, h)
		if !c.IsMoE(l) {
			ffn := int64(c.IntermediateSize)
			add(pre+"mlp.gate_proj.weight", kindWeight, l, Q4K, ffn, h)
			add(pre+"mlp.up_proj.weight", kindWeight, l, Q4K, ffn, h)
			add(pre+"mlp.down_proj.weight", kindWeight, l, Q4K, h, ffn)
			continue
		}
		add(pre+"mlp.gate.weight", kindRouter, l, F32, int64(c.Experts()), h)
		if c.NumSharedExperts > 0 {
			ffn := int64(c.ExpertFFN() * c.NumSharedExperts)
			add(pre+"mlp.shared_experts.gate_proj.weight", kindWeight, l, Q4K, ffn, h)
			add(pre+"mlp.shared_experts.up_proj.weight", kindWeight, l, Q4K, ffn, h)
			add(pre+"mlp.shared_experts.down_proj.weight", kindWeight, l, Q4K, h, ffn)
		}
	}
	add("model.norm.weight", kindNorm, -1, F32, 1, h)
	add("lm_head.weight", kindWeight, -1, Q4K, int64(c.VocabSize), h)
	// Experts: gate, up and down of one expert adjacent. One that fits a
	// shard goes whole into one, so it never crosses a shard's end; a
	// larger one (Mixtral's) starts a shard and each matrix goes whole into
	// a shard: the shards are laid end to end, so the expert stays one
	// range of the model's bytes.
	ffn := int64(c.ExpertFFN())
	mat, _ := Q4K.Bytes(ffn*h, h)
	for l := 0; l < c.NumHiddenLayers; l++ {
		if !c.IsMoE(l) {
			continue
		}
		for e := 0; e < c.Experts(); e++ {
			pre := fmt.Sprintf("model.layers.%d.mlp.experts.%d.", l, e)
			names := []string{pre + "gate_proj.weight", pre + "up_proj.weight", pre + "down_proj.weight"}
			pk.Group(3 * mat) // the whole expert in one shard, or from a shard's start
			ts := []*Tensor{
				add(names[0], kindWeight, l, Q4K, ffn, h),
				add(names[1], kindWeight, l, Q4K, ffn, h),
				add(names[2], kindWeight, l, Q4K, h, ffn),
			}
			lo.Manifest.Experts = append(lo.Manifest.Experts, Expert{Layer: l, Index: e, Tensors: names, Shard: ts[0].Shard, Offset: ts[0].Offset, Size: 3 * mat})
		}
	}
	lo.Manifest.Shards, lo.Manifest.TotalSize = pk.Shards()
	lo.expertRanks()
	starts := lo.Manifest.shardStarts()
	lo.byShard = make([][]int, len(lo.Manifest.Shards))
	for i := range lo.placed {
		pl := &lo.placed[i]
		pl.start = starts[pl.t.Shard] + pl.t.Offset
		for s := pl.t.Shard; s < len(lo.Manifest.Shards) && starts[s] < pl.start+pl.t.Size; s++ {
			lo.byShard[s] = append(lo.byShard[s], i)
		}
	}
	return lo, nil
}

// ShardBytes fills dst (len = shard i's size) with shard i's bytes: a pure
// function of the preset, the seed and i, so any seeder can regenerate a
// shard instead of storing it. Safe for concurrent use.
func (lo *Layout) ShardBytes(i int, dst []byte) error {
	if i < 0 || i >= len(lo.Manifest.Shards) {
		return fmt.Errorf("synth: shard %d of %d", i, len(lo.Manifest.Shards))
	}
	size := lo.Manifest.Shards[i].Size
	if int64(len(dst)) != size {
		return fmt.Errorf("synth: shard %d is %d bytes; buffer is %d", i, size, len(dst))
	}
	clear(dst)
	start := lo.Manifest.shardStarts()[i]
	for _, k := range lo.byShard[i] {
		pl := &lo.placed[k]
		a := max(pl.start, start)
		b := min(pl.start+pl.t.Size, start+size)
		lo.fill(pl, a-pl.start, dst[a-start:b-start])
	}
	return nil
}

// fill writes bytes [off, off+len(dst)) of tensor pl.
func (lo *Layout) fill(pl *placed, off int64, dst []byte) {
	switch pl.t.DType {
	case Q4K:
		var blk [q4k.BlockBytes]byte
		stdev := 1 / math.Sqrt(float64(pl.cols))
		for len(dst) > 0 {
			b := off / q4k.BlockBytes
			q4kBlock(&blk, mix(lo.seed, pl.id, uint64(b)), stdev, pl.kind == kindEmbed)
			n := copy(dst, blk[off-b*q4k.BlockBytes:])
			dst, off = dst[n:], off+int64(n)
		}
	case F32:
		for j := off / 4; len(dst) > 0; j++ {
			v := lo.f32Value(pl, j)
			var w [4]byte
			binary.LittleEndian.PutUint32(w[:], math.Float32bits(v))
			n := copy(dst, w[off-j*4:])
			dst, off = dst[n:], off+int64(n)
		}
	}
}

// f32Value is element j of an F32 tensor.
func (lo *Layout) f32Value(pl *placed, j int64) float32 {
	r := mix(lo.seed, pl.id, uint64(j))
	switch pl.kind {
	case kindRouter:
		rank := lo.ranks[pl.layer][j/pl.cols]
		bias := RouterBias * -math.Log(float64(rank+1)) / math.Sqrt(float64(pl.cols))
		return float32(bias + RouterNoise*gauss(r)/math.Sqrt(float64(pl.cols)))
	default: // norms: 1 +- 0.05
		return float32(1 + 0.1*(unit(r)-0.5))
	}
}

// expertRanks gives each MoE layer a fixed random permutation of its
// experts' popularity ranks (rank 0 is the most popular).
func (lo *Layout) expertRanks() {
	c := &lo.Manifest.Config
	lo.ranks = make([][]int, c.NumHiddenLayers)
	for l := range lo.ranks {
		if !c.IsMoE(l) {
			continue
		}
		n := c.Experts()
		keys := make([]uint64, n)
		order := make([]int, n)
		for i := range keys {
			keys[i], order[i] = mix(lo.seed, 1<<40|uint64(l), uint64(i)), i
		}
		sort.Slice(order, func(a, b int) bool { return keys[order[a]] < keys[order[b]] })
		lo.ranks[l] = make([]int, n)
		for r, e := range order {
			lo.ranks[l][e] = r
		}
	}
}

// q4kBlock writes one valid Q4_K block whose weights have mean 0 (or a
// drift of EmbedDrift standard deviations) and standard deviation about
// stdev: weight = d*sc*(q-7.5) (- drift), sc in [8, 15], q uniform.
func q4kBlock(blk *[q4k.BlockBytes]byte, r uint64, stdev float64, drift bool) {
	// The quants: 128 bytes of PRNG output.
	s := r
	for i := 16; i < q4k.BlockBytes; i += 8 {
		s = splitmix(s)
		binary.LittleEndian.PutUint64(blk[i:], s)
	}
	s = splitmix(s)
	var sc, m [8]uint8
	for j := range sc {
		sc[j] = 8 + uint8(s>>(4*j))&7
		m[j] = sc[j]
		if drift {
			m[j]-- // lowers the subtracted min: a positive mean
		}
	}
	packed := q4k.PackScaleMin(sc, m)
	copy(blk[4:16], packed[:])
	// std of d*sc*(q-7.5) with sc ~ 11.5 and q uniform in 0..15 is
	// d*11.5*4.61; m = sc-1 adds a mean of 7.5*d, EmbedDrift of that.
	d := stdev / (11.5 * 4.61)
	binary.LittleEndian.PutUint16(blk[0:], q4k.ToF16(float32(d)))
	binary.LittleEndian.PutUint16(blk[2:], q4k.ToF16(float32(7.5*d)))
}

// splitmix is SplitMix64's step and output function.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	z := x
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// mix derives the random state of element (or block) j of tensor id.
func mix(seed, id, j uint64) uint64 {
	return splitmix(splitmix(seed^id*0xd1b54a32d192ed03) ^ j*0x8cb92ba72f3d8dd7)
}

// unit maps r to [0, 1).
func unit(r uint64) float64 { return float64(r>>11) / (1 << 53) }

// gauss maps r to a standard normal sample (Box-Muller on two halves).
func gauss(r uint64) float64 {
	u1 := (float64(r>>40) + 0.5) / (1 << 24)
	u2 := float64(r&(1<<24-1)) / (1 << 24)
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// Progress reports work done of a total (bytes).
type Progress func(done, total int64)

// Hash computes every shard's bytes and BLAKE3 hash into the manifest,
// over workers goroutines (0: one per CPU). It holds one shard per worker
// in memory.
func (lo *Layout) Hash(ctx context.Context, workers int, progress Progress) error {
	return lo.each(ctx, workers, progress, func(i int, b []byte) error {
		d := cas.Sum(b).Digest()
		lo.Manifest.Shards[i].Hash = hex.EncodeToString(d[:])
		return nil
	})
}

// each generates every shard in parallel and calls f with its bytes.
func (lo *Layout) each(ctx context.Context, workers int, progress Progress, f func(i int, b []byte) error) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	g, ctx := errgroup.WithContext(ctx)
	next := atomic.Int64{}
	done := atomic.Int64{}
	total := lo.Manifest.TotalSize
	var mu sync.Mutex
	for range workers {
		g.Go(func() error {
			var buf []byte
			for {
				i := int(next.Add(1) - 1)
				if i >= len(lo.Manifest.Shards) {
					return nil
				}
				if err := ctx.Err(); err != nil {
					return err
				}
				size := lo.Manifest.Shards[i].Size
				if int64(cap(buf)) < size {
					buf = make([]byte, size)
				}
				b := buf[:size]
				if err := lo.ShardBytes(i, b); err != nil {
					return err
				}
				if err := f(i, b); err != nil {
					return err
				}
				d := done.Add(size)
				if progress != nil {
					mu.Lock()
					progress(d, total)
					mu.Unlock()
				}
			}
		})
	}
	return g.Wait()
}

// WriteModel generates, hashes and writes every shard into dir, then
// manifest.json (last, so a directory with a manifest is complete). With
// procedural set it writes only the manifest: a seeder regenerates the
// shards from it (Source).
func (lo *Layout) WriteModel(ctx context.Context, dir string, procedural bool, progress Progress) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := lo.each(ctx, 0, progress, func(i int, b []byte) error {
		d := cas.Sum(b).Digest()
		lo.Manifest.Shards[i].Hash = hex.EncodeToString(d[:])
		if procedural {
			return nil
		}
		return atomicfile.Write(filepath.Join(dir, lo.Manifest.Shards[i].Filename), b, 0o644)
	})
	if err != nil {
		return err
	}
	if err := lo.Manifest.Validate(); err != nil {
		return fmt.Errorf("synth: the layout is invalid: %w", err)
	}
	mb, err := lo.Manifest.Encode()
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, ManifestFile), mb, 0o644)
}

// ManifestFile is the manifest's name in a model directory.
const ManifestFile = "manifest.json"
