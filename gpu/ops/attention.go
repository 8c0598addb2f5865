package ops

import (
	"context"
	"math"
	"slices"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// The attention ops: RoPE, decode attention over a KV cache, and the
// store of a decode step's row into the cache.

// RopeShape describes a RoPE call: x is [Tokens][Heads][HeadDim]; the first
// RotDim elements of each head rotate at position Pos0 + token.
type RopeShape struct {
	Tokens, Heads, HeadDim, RotDim, Pos0 int
	Style                                abi.RopeStyle
}

// RopeFreqs returns the RotDim/2 inverse frequencies theta^(-2i/rot),
// computed in float64 and rounded once, for upload as Rope's freqs.
func RopeFreqs(theta float64, rot int) []float32 {
	f := make([]float32, rot/2)
	for i := range f {
		f[i] = float32(math.Pow(theta, -2*float64(i)/float64(rot)))
	}
	return f
}

// RopeLaunch is the dispatch rule of Rope. Bindings: x (read and
// written), freqs.
func RopeLaunch(s RopeShape) (Launch, error) {
	const name = "rope"
	if s.Tokens <= 0 || s.Heads <= 0 || s.HeadDim <= 0 || s.RotDim <= 0 || s.RotDim%2 != 0 || s.RotDim > s.HeadDim || s.Pos0 < 0 {
		return Launch{}, shapeErr(name, "%+v", s)
	}
	total := uint64(s.Tokens * s.Heads * s.RotDim / 2)
	gx, gy := grid(ceilDiv(total, 256))
	p := gpu.Params{}.U32(uint32(s.Tokens)).U32(uint32(s.Heads)).U32(uint32(s.HeadDim)).U32(uint32(s.RotDim)).
		U32(uint32(s.Pos0)).U32(uint32(s.Style)).U32(gx)
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1}, Params: p,
		Bindings: []Binding{{"x", uint64(s.Tokens * s.Heads * s.HeadDim * 4)}, {"freqs", uint64(s.RotDim / 2 * 4)}}}, nil
}

// Rope records the rotation of x in place by freqs (RotDim/2 f32 values,
// see RopeFreqs).
func (k *Kernels) Rope(ctx context.Context, b *gpu.Batch, x, freqs gpu.Region, s RopeShape) error {
	l, err := RopeLaunch(s)
	return k.launch(ctx, b, l, err, x, freqs)
}

// AttnShape describes decode attention: Heads query heads of HeadDim
// (<= 256, a multiple of 4), KVHeads cache heads (Heads a multiple of it;
// 8 query heads of HeadDim at most 1024 dimensions), KVLen cached
// positions; Scale multiplies q.k (usually 1/sqrt(HeadDim)).
type AttnShape struct {
	Heads, KVHeads, HeadDim, KVLen int
	Scale                          float32
}

// check validates s and returns the bindings q, k, v, out.
func (s AttnShape) check(name string) ([]Binding, error) {
	if s.Heads <= 0 || s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 || s.HeadDim <= 0 || s.HeadDim > 256 || s.HeadDim%4 != 0 ||
		s.KVLen <= 0 || s.Heads > 65535 || min(s.Heads/s.KVHeads, 8)*s.HeadDim > 1024 || s.KVLen > 1<<24 {
		return nil, shapeErr(name, "%+v (HeadDim <= 256 and a multiple of 4; Heads a multiple of KVHeads; at most 1024 dimensions in 8 query heads; KVLen <= 2^24)", s)
	}
	kv := uint64(s.KVLen * s.KVHeads * s.HeadDim * 4)
	return []Binding{{"q", uint64(s.Heads * s.HeadDim * 4)}, {"k", kv}, {"v", kv}, {"out", uint64(s.Heads * s.HeadDim * 4)}}, nil
}

// attnChunk is the positions one attention_split workgroup takes (the
// kernel's override constant CH: 16, 32 or 64). On the H100 32 was the
// fastest at every length (BenchmarkQ4KDecode, 32 query heads over 8
// cache heads of 128: 200 positions 8.8 us against 12.9 for 64 and 11.9
// for 16; 1000 positions 12.0 against 13.5 and 15.1; 4096 positions 29.3
// against 29.7 and 38.8). A variable only for that benchmark.
var attnChunk = 32

// AttentionLaunches are the dispatch rules of Attention: attention_split
// over chunks of attnChunk positions (bindings q, k, v, partials), then
// attention_merge over the chunks (bindings partials, out), and the bytes
// of the partials (a scratch buffer between them).
func AttentionLaunches(s AttnShape) (split, merge Launch, partials uint64, err error) {
	binds, err := s.check("attention")
	if err != nil {
		return Launch{}, Launch{}, 0, err
	}
	ch := attnChunk
	chunks := (s.KVLen + ch - 1) / ch
	partials = uint64(s.Heads * chunks * (s.HeadDim + 2) * 4)
	groups := (s.Heads/s.KVHeads + 7) / 8 // query heads of a cache head, 8 a workgroup
	consts := map[string]float64{"CH": float64(ch), "V": 0}
	if ch == 32 && (s.HeadDim == 32 || s.HeadDim == 64 || s.HeadDim == 128) {
		// main_v's shapes (attention_split.wgsl), the head dimension a
		// constant too: one register fewer for the RoPE flavor on an
		// H200, 4 workgroups an SM instead of 3. So are the cache heads
		// and, where one workgroup takes them all, the query heads of
		// each: the loops over a workgroup's heads fold.
		consts["V"], consts["HD"], consts["NKV"] = 1, float64(s.HeadDim), float64(s.KVHeads)
		if g := s.Heads / s.KVHeads; g <= 8 {
			consts["GQ"] = float64(g)
		}
	}
	split = Launch{Kernel: "attention_split", Constants: consts, Groups: [3]uint32{uint32(chunks), uint32(s.KVHeads), uint32(groups)},
		Params: gpu.Params{}.U32(uint32(s.Heads)).U32(uint32(s.KVHeads)).U32(uint32(s.HeadDim)).U32(uint32(s.KVLen)).F32(s.Scale).
			U32(uint32(chunks)).U32(0).U32(0),
		Bindings: append(binds[:3:3], Binding{"partials", partials})}
	merge = Launch{Kernel: "attention_merge", Constants: map[string]float64{"HD": float64(s.HeadDim)}, Groups: [3]uint32{uint32(s.Heads), uint32((s.HeadDim + 31) / 32), 1},
		Params:   gpu.Params{}.U32(uint32(s.Heads)).U32(uint32(s.HeadDim)).U32(uint32(chunks)).U32(0),
		Bindings: []Binding{{"partials", partials}, binds[3]}}
	return split, merge, partials, nil
}

// Attention records decode attention of q ([Heads][HeadDim]) over the
// cache k, v ([>= KVLen][KVHeads][HeadDim]) into out ([Heads][HeadDim]).
// It runs split over positions (flash-decoding): chunks of 32 positions
// (attnChunk) per workgroup, every cache head's query heads
// together, then a merge of the chunks' softmax partials; the partials
// live in a scratch buffer of the batch.
func (k *Kernels) Attention(ctx context.Context, b *gpu.Batch, q, kc, vc, out gpu.Region, s AttnShape) error {
	return k.attention(ctx, b, q, kc, vc, out, nil, s)
}

// AttentionXQ is Attention that also writes out quantized into outq
// (QuantizeX's form: the x of a product with XQ), in the merge
// (attention_merge_xq). Heads * HeadDim values; HeadDim a multiple of
// XQGroup.
func (k *Kernels) AttentionXQ(ctx context.Context, b *gpu.Batch, q, kc, vc, out, outq gpu.Region, s AttnShape) error {
	if outq == nil {
		return b.Fail(shapeErr("attention_merge_xq", "no quantized output"))
	}
	return k.attention(ctx, b, q, kc, vc, out, outq, s)
}

func (k *Kernels) attention(ctx context.Context, b *gpu.Batch, q, kc, vc, out, outq gpu.Region, s AttnShape) error {
	split, merge, partials, err := AttentionLaunches(s)
	if err != nil {
		return b.Fail(err)
	}
	return k.splitMerge(ctx, b, split, merge, partials, []gpu.Region{q, kc, vc}, nil, out, outq, s)
}

// MergeXQLaunch is the dispatch rule of attention_merge_xq, merge's
// flavor (AttentionLaunches' merge of s) that also writes its output
// quantized for a product of quantized x: a binding more.
func MergeXQLaunch(merge Launch, s AttnShape) (Launch, error) {
	if s.HeadDim%XQGroup != 0 {
		return Launch{}, shapeErr("attention_merge_xq", "head dim %d (a multiple of %d)", s.HeadDim, XQGroup)
	}
	merge.Kernel = "attention_merge_xq"
	merge.Bindings = append(slices.Clip(merge.Bindings), Binding{"quantized out", XQBytes(s.Heads * s.HeadDim)})
	return merge, nil
}

// splitMerge records an attention's split, bound to in (q, k cache, v
// cache), the partials (a scratch buffer of the batch) and extra, then
// its merge into out, and into outq quantized if not nil.
func (k *Kernels) splitMerge(ctx context.Context, b *gpu.Batch, split, merge Launch, partials uint64, in, extra []gpu.Region, out, outq gpu.Region, s AttnShape) error {
	if outq != nil {
		var err error
		if merge, err = MergeXQLaunch(merge, s); err != nil {
			return b.Fail(err)
		}
	}
	for i, r := range in {
		if err := need("attention", split.Bindings[i].Name, r, split.Bindings[i].Bytes); err != nil {
			return b.Fail(err)
		}
	}
	for i, r := range extra {
		bd := split.Bindings[len(in)+1+i]
		if err := need("attention", bd.Name, r, bd.Bytes); err != nil {
			return b.Fail(err)
		}
	}
	if err := need("attention", "out", out, merge.Bindings[1].Bytes); err != nil {
		return b.Fail(err)
	}
	part, err := b.Scratch(partials)
	if err != nil {
		return err
	}
	bind := append(append(append([]gpu.Region(nil), in...), part), extra...)
	if err := k.record(ctx, b, split, bind...); err != nil {
		return err
	}
	if outq != nil {
		return k.record(ctx, b, merge, part, out, outq)
	}
	return k.record(ctx, b, merge, part, out)
}

// RopeAttentionLaunches are the dispatch rules of RopeAttention where
// one split dispatch can rotate and store (attention_split_rope: chunks
// of 32, HeadDim 64 or 128, NeoX over whole heads, one token whose row
// is the cache's last, q k v stacked as one product writes them), ok
// false where it cannot. Bindings of the split: q k v, k cache, v cache,
// partials, freqs.
func RopeAttentionLaunches(s AttnShape, rs RopeShape, kv KVShape) (split, merge Launch, partials uint64, ok bool, err error) {
	split, merge, partials, err = AttentionLaunches(s)
	if err != nil {
		return Launch{}, Launch{}, 0, false, err
	}
	if _, err := RopeKVLaunch(rs, kv); err != nil {
		return Launch{}, Launch{}, 0, false, err
	}
	hd := s.HeadDim
	if attnChunk != 32 || (hd != 64 && hd != 128) || rs.Style != abi.RopeNeoX || rs.RotDim != hd || rs.HeadDim != hd ||
		rs.Heads != s.Heads+s.KVHeads || kv.Dim != s.KVHeads*hd || kv.KOff != s.Heads*hd || kv.VOff != kv.KOff+kv.Dim ||
		kv.Pos != s.KVLen-1 || rs.Pos0 != kv.Pos {
		return split, merge, partials, false, nil
	}
	split.Kernel = "attention_split_rope"
	split.Params = split.Params.U32(uint32(kv.KOff)).U32(uint32(kv.VOff)).U32(0).U32(0)
	split.Bindings = []Binding{{"q k v", uint64(kv.VOff+kv.Dim) * 4}, split.Bindings[1], split.Bindings[2], split.Bindings[3], {"freqs", uint64(hd / 2 * 4)}}
	return split, merge, partials, true, nil
}

// RopeAttention records a decode step's RoPE, cache store and attention:
// qkv holds the step's q, k and v rows stacked (as RopeKV takes them),
// unrotated; kc[kv.Pos] and vc[kv.Pos] get the rotated k and the v row,
// and out (and outq, if not nil, as AttentionXQ) the attention of the
// rotated q over the caches' s.KVLen rows. Where RopeAttentionLaunches
// allows it, the rotation and the store run inside the attention's split
// dispatch, one dependent dispatch fewer than RopeKV and then Attention,
// which it records otherwise; either way q and k are rotated in qkv
// only by the latter, so read only the caches and out after it.
func (k *Kernels) RopeAttention(ctx context.Context, b *gpu.Batch, qkv, freqs, kc, vc, out, outq gpu.Region, s AttnShape, rs RopeShape, kv KVShape) error {
	split, merge, partials, ok, err := RopeAttentionLaunches(s, rs, kv)
	if err != nil {
		return b.Fail(err)
	}
	if !ok {
		if err := k.RopeKV(ctx, b, qkv, freqs, kc, vc, rs, kv); err != nil {
			return err
		}
		q := gpu.SpanOf(qkv)
		q = q.Buffer().Sub(q.Offset(), uint64(s.Heads*s.HeadDim*4))
		if outq != nil {
			return k.AttentionXQ(ctx, b, q, kc, vc, out, outq, s)
		}
		return k.Attention(ctx, b, q, kc, vc, out, s)
	}
	return k.splitMerge(ctx, b, split, merge, partials, []gpu.Region{qkv, kc, vc}, []gpu.Region{freqs}, out, outq, s)
}

// KVShape is a decode step's store into the caches: rows of Dim floats,
// the key row from float KOff of the source, the value row from VOff, at
// cache position Pos.
type KVShape struct {
	Dim, KOff, VOff, Pos int
}

// RopeKVLaunch is the dispatch rule of RopeKV: rope_kv, the rule of Rope
// for one token plus a thread per cache element that no pair writes.
// Bindings: x, freqs, k cache, v cache.
func RopeKVLaunch(s RopeShape, kv KVShape) (Launch, error) {
	const name = "rope_kv"
	l, err := RopeLaunch(s)
	if err != nil {
		return Launch{}, &gpu.KernelError{Kernel: name, Op: "shape", Err: err}
	}
	hd := s.HeadDim
	if s.Tokens != 1 || kv.Dim <= 0 || kv.Dim%hd != 0 || kv.KOff%hd != 0 || kv.KOff/hd+kv.Dim/hd != s.Heads ||
		kv.VOff < kv.KOff+kv.Dim || kv.Pos < 0 || uint64(kv.Pos+1)*uint64(kv.Dim) > math.MaxUint32 {
		return Launch{}, shapeErr(name, "%+v with k heads at %d (%d floats, the last heads of %d) and v at %d, position %d (one token)",
			s, kv.KOff, kv.Dim, s.Heads, kv.VOff, kv.Pos)
	}
	pairs := uint64(s.Heads * s.RotDim / 2)
	gx, gy := grid(ceilDiv(pairs+2*uint64(kv.Dim), 256))
	cache := uint64(kv.Pos+1) * uint64(kv.Dim) * 4
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1},
		Params: gpu.Params{}.U32(1).U32(uint32(s.Heads)).U32(uint32(hd)).U32(uint32(s.RotDim)).
			U32(uint32(s.Pos0)).U32(uint32(s.Style)).U32(gx).
			U32(uint32(kv.KOff / hd)).U32(uint32(kv.Dim)).U32(uint32(kv.VOff)).U32(uint32(kv.Pos)),
		Bindings: []Binding{{"x", uint64(kv.VOff+kv.Dim) * 4}, l.Bindings[1], {"k cache", cache}, {"v cache", cache}}}, nil
}

// RopeKV records a decode step's RoPE and cache store in one dispatch:
// Rope of x's s.Heads heads (q heads, then k heads: x as a stacked q, k
// and v product writes it), then kc[kv.Pos] = the rotated k heads
// (x[kv.KOff:kv.KOff+kv.Dim]) and vc[kv.Pos] = x[kv.VOff:kv.VOff+kv.Dim].
// The same as Rope and then KVStore, one fixed dispatch cost less.
func (k *Kernels) RopeKV(ctx context.Context, b *gpu.Batch, x, freqs, kc, vc gpu.Region, s RopeShape, kv KVShape) error {
	l, err := RopeKVLaunch(s, kv)
	return k.launch(ctx, b, l, err, x, freqs, kc, vc)
}

// KVStoreLaunch is the dispatch rule of KVStore. Bindings: src, k cache,
// v cache.
func KVStoreLaunch(s KVShape) (Launch, error) {
	const name = "kv_store"
	n, kOff, vOff, pos := s.Dim, s.KOff, s.VOff, s.Pos
	if n <= 0 || kOff < 0 || vOff < 0 || pos < 0 || uint64(pos+1)*uint64(n) > math.MaxUint32 {
		return Launch{}, shapeErr(name, "rows of %d at position %d, from %d and %d", n, pos, kOff, vOff)
	}
	cache := uint64(pos+1) * uint64(n) * 4
	return Launch{Kernel: name, Groups: [3]uint32{uint32(ceilDiv(uint64(n), 256)), 1, 1},
		Params:   gpu.Params{}.U32(uint32(n)).U32(uint32(kOff)).U32(uint32(vOff)).U32(uint32(pos)),
		Bindings: []Binding{{"src", uint64(max(kOff, vOff)+n) * 4}, {"k cache", cache}, {"v cache", cache}}}, nil
}

// KVStore records kc[Pos] = src[KOff:KOff+Dim] and vc[Pos] =
// src[VOff:VOff+Dim] (kc and vc are [>Pos][Dim] caches): a decode step's
// new cache row, with the caches bound whole so that the binding does not
// change with the position.
func (k *Kernels) KVStore(ctx context.Context, b *gpu.Batch, src, kc, vc gpu.Region, s KVShape) error {
	l, err := KVStoreLaunch(s)
	return k.launch(ctx, b, l, err, src, kc, vc)
}
