package experts

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sort"

	"github.com/rdrr/peer/cas"
)

// Limits on what Decode accepts, checked before anything is allocated from
// a number in the manifest.
const (
	// MaxManifestBytes bounds a manifest file: it is one blob, so at most
	// one shard (the 671B-shaped manifest is about 6 MB).
	MaxManifestBytes = cas.ShardSize
	// MaxShards bounds the shard list: 65536 shards of 64 MiB is 4 TiB.
	MaxShards = 1 << 16
	// MaxTensors bounds the tensor table.
	MaxTensors = 1 << 20
	// MaxDims bounds a tensor's rank.
	MaxDims = 4
	// MaxDim bounds one dimension.
	MaxDim = 1 << 32
	// MaxLayers and MaxExperts bound the config and the experts index.
	MaxLayers  = 1024
	MaxExperts = 4096
)

// ShardSize is the largest shard: a shard is one raw blob of a collection.
const ShardSize = cas.ShardSize

// Manifest is an RDRR model: its config, where each tensor lies in which
// shard, the shards' sizes and BLAKE3 hashes, and the index of experts.
// FORMAT.md describes it field by field.
type Manifest struct {
	ModelID       string             `json:"modelId"`
	Version       int                `json:"version"`
	Quantization  string             `json:"quantization"`
	TotalSize     int64              `json:"totalSize"`
	HashAlgorithm string             `json:"hashAlgorithm"`
	Config        Config             `json:"config"`
	Tensors       map[string]*Tensor `json:"tensors"`
	Shards        []ShardInfo        `json:"shards"`
	Experts       []Expert           `json:"experts,omitempty"`
	// Synth says how a synthetic model's bytes are made, so that a seeder
	// can regenerate any shard instead of storing it (absent for real models).
	Synth *SynthInfo `json:"synth,omitempty"`
	// Tokenizer is the model's own tokenizer, when it came with one (GGUF);
	// synthetic models use bytes as tokens.
	Tokenizer *Tokenizer `json:"tokenizer,omitempty"`

	expertAt map[[2]int]int // (layer, expert) -> index in Experts, set by Validate
}

// Tokenizer is a GGUF tokenizer's data (tokenizer.ggml.*).
type Tokenizer struct {
	Model  string    `json:"model"`         // llama (SentencePiece), gpt2 (BPE), ...
	Pre    string    `json:"pre,omitempty"` // tokenizer.ggml.pre, the pre-tokenizer's name, if any
	Tokens []string  `json:"tokens"`
	Scores []float32 `json:"scores,omitempty"`
	Types  []int32   `json:"types,omitempty"`
	Merges []string  `json:"merges,omitempty"`
	BOS    int       `json:"bos"`
	EOS    int       `json:"eos"`
	// Optional (absent in manifests made before them, and where the GGUF
	// file has no such key): tokenizer.ggml.add_bos_token and
	// add_eos_token (absent: llama.cpp's default for the model),
	// unknown_token_id and padding_token_id, and add_space_prefix
	// (SentencePiece's "▁" in front of the text; absent: true).
	AddBOS         *bool `json:"add_bos,omitempty"`
	AddEOS         *bool `json:"add_eos,omitempty"`
	UNK            *int  `json:"unk,omitempty"`
	PAD            *int  `json:"pad,omitempty"`
	AddSpacePrefix *bool `json:"add_space_prefix,omitempty"`
	// Optional, ascending token ids: where the text of such a token is
	// found in a prompt and becomes that token, the ASCII whitespace next
	// to it, on its left (LStrip) or right (RStrip), is dropped
	// (llama.cpp's token attributes LSTRIP and RSTRIP; a GGUF file gets
	// them from llama.cpp's rules for its model, gguf.Tokenizer).
	LStrip []int `json:"lstrip,omitempty"`
	RStrip []int `json:"rstrip,omitempty"`
}

// MaxVocab bounds a tokenizer's tokens.
const MaxVocab = 1 << 20

func (t *Tokenizer) validate() error {
	n := len(t.Tokens)
	switch {
	case n == 0 || n > MaxVocab:
		return fieldErr("tokenizer.tokens", "%d tokens (want 1 to %d)", n, MaxVocab)
	case t.Scores != nil && len(t.Scores) != n:
		return fieldErr("tokenizer.scores", "%d scores for %d tokens", len(t.Scores), n)
	case t.Types != nil && len(t.Types) != n:
		return fieldErr("tokenizer.types", "%d types for %d tokens", len(t.Types), n)
	case len(t.Merges) > MaxVocab:
		return fieldErr("tokenizer.merges", "%d merges", len(t.Merges))
	case t.BOS < -1 || t.BOS >= n:
		return fieldErr("tokenizer.bos", "%d (the vocabulary has %d tokens)", t.BOS, n)
	case t.EOS < -1 || t.EOS >= n:
		return fieldErr("tokenizer.eos", "%d (the vocabulary has %d tokens)", t.EOS, n)
	case t.UNK != nil && (*t.UNK < 0 || *t.UNK >= n):
		return fieldErr("tokenizer.unk", "%d (the vocabulary has %d tokens)", *t.UNK, n)
	case t.PAD != nil && (*t.PAD < 0 || *t.PAD >= n):
		return fieldErr("tokenizer.pad", "%d (the vocabulary has %d tokens)", *t.PAD, n)
	case t.AddBOS != nil && *t.AddBOS && t.BOS < 0:
		return fieldErr("tokenizer.add_bos", "true, but there is no bos token")
	case t.AddEOS != nil && *t.AddEOS && t.EOS < 0:
		return fieldErr("tokenizer.add_eos", "true, but there is no eos token")
	}
	for _, f := range []struct {
		name string
		ids  []int
	}{{"tokenizer.lstrip", t.LStrip}, {"tokenizer.rstrip", t.RStrip}} {
		// Strictly ascending ids of the vocabulary: one way to write a
		// set, and at most one entry per token.
		prev := -1
		for i, id := range f.ids {
			if id <= prev || id >= n {
				return fieldErr(f.name, "[%d] = %d (want ascending token ids, each 0 to %d)", i, id, n-1)
			}
			prev = id
		}
	}
	return nil
}

// Config holds the model's hyperparameters under HuggingFace's names.
// Unknown fields of a config.json are ignored (HuggingFace configs carry
// many); the ones here are checked by Validate.
type Config struct {
	ModelType           string  `json:"model_type"`
	HiddenSize          int     `json:"hidden_size"`
	NumHiddenLayers     int     `json:"num_hidden_layers"`
	NumAttentionHeads   int     `json:"num_attention_heads"`
	NumKeyValueHeads    int     `json:"num_key_value_heads"`
	HeadDim             int     `json:"head_dim,omitempty"`
	IntermediateSize    int     `json:"intermediate_size"`
	MoEIntermediateSize int     `json:"moe_intermediate_size,omitempty"`
	NumExperts          int     `json:"num_local_experts,omitempty"`
	NumRoutedExperts    int     `json:"n_routed_experts,omitempty"`
	NumSharedExperts    int     `json:"n_shared_experts,omitempty"`
	NumExpertsPerTok    int     `json:"num_experts_per_tok"`
	FirstKDenseReplace  int     `json:"first_k_dense_replace,omitempty"`
	ScoringFunc         string  `json:"scoring_func,omitempty"`
	NGroup              int     `json:"n_group,omitempty"`
	TopKGroup           int     `json:"topk_group,omitempty"`
	VocabSize           int     `json:"vocab_size"`
	MaxPositions        int     `json:"max_position_embeddings,omitempty"`
	RMSNormEps          float64 `json:"rms_norm_eps"`
	RopeTheta           float64 `json:"rope_theta"`
}

// UnmarshalJSON decodes a config leniently: a HuggingFace config.json
// carries many fields this package does not use, and they are ignored.
func (c *Config) UnmarshalJSON(b []byte) error {
	type plain Config
	return json.Unmarshal(b, (*plain)(c))
}

// Experts returns the number of routed experts per MoE layer.
func (c *Config) Experts() int { return max(c.NumExperts, c.NumRoutedExperts) }

// ExpertFFN returns the hidden size of one routed expert.
func (c *Config) ExpertFFN() int {
	if c.MoEIntermediateSize > 0 {
		return c.MoEIntermediateSize
	}
	return c.IntermediateSize
}

// HeadDimension returns the attention head size.
func (c *Config) HeadDimension() int {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	if c.NumAttentionHeads == 0 {
		return 0
	}
	return c.HiddenSize / c.NumAttentionHeads
}

// IsMoE reports whether layer l routes to experts (DeepSeek's first
// first_k_dense_replace layers are dense).
func (c *Config) IsMoE(l int) bool { return c.Experts() > 0 && l >= c.FirstKDenseReplace }

// MoELayers is how many layers route to experts.
func (c *Config) MoELayers() int {
	n := 0
	for l := range c.NumHiddenLayers {
		if c.IsMoE(l) {
			n++
		}
	}
	return n
}

// Tensor says where one tensor's bytes are. Offset is inside shard Shard;
// a tensor larger than what is left of its shard continues at the start
// of the next shards (only dense tensors larger than a shard do: see
// FORMAT.md). Shape lists dimensions outermost first: [rows, cols] for a
// matrix, whose rows are contiguous.
type Tensor struct {
	Shard  int     `json:"shard"`
	Offset int64   `json:"offset"`
	Size   int64   `json:"size"`
	Shape  []int64 `json:"shape"`
	DType  DType   `json:"dtype"`
}

// ShardInfo is one shard file: its name in a model directory, size and
// BLAKE3 hash in hex (the digest of its raw CID).
type ShardInfo struct {
	Filename string `json:"filename"`
	Size     int64  `json:"size"`
	Hash     string `json:"hash"`
}

// Digest returns the shard's BLAKE3 digest; Validate has checked it.
func (s *ShardInfo) Digest() cas.Digest {
	var d cas.Digest
	hex.Decode(d[:], []byte(s.Hash))
	return d
}

// CID returns the shard's raw CID.
func (s *ShardInfo) CID() cas.CID { return cas.RawCID(s.Digest()) }

// Expert is one routed expert of one layer: the tensors it is made of
// and the byte range they fill together. The range lies inside one shard,
// or, for an expert larger than a shard (Mixtral's are 99 MB in Q4_K),
// starts at a shard's start and fills consecutive shards.
type Expert struct {
	Layer   int      `json:"layer"`
	Index   int      `json:"expert"`
	Tensors []string `json:"tensors"`
	Shard   int      `json:"shard"`
	Offset  int64    `json:"offset"`
	Size    int64    `json:"size"`
}

// SynthInfo names the generator of a synthetic model.
type SynthInfo struct {
	Preset string `json:"preset"`
	Seed   uint64 `json:"seed"`
}

// DType is a tensor's element encoding.
type DType string

// The dtypes a manifest may use.
const (
	Q4K  DType = "Q4_K"
	F16  DType = "F16"
	BF16 DType = "BF16"
	F32  DType = "F32"
)

// Known reports whether d is one of the dtypes above.
func (d DType) Known() bool { return d == Q4K || d == F16 || d == BF16 || d == F32 }

// Bytes returns the size of n elements whose innermost dimension is inner,
// or an error if they cannot be stored (Q4_K needs whole 256-weight blocks
// in every row).
func (d DType) Bytes(n, inner int64) (int64, error) {
	switch d {
	case F32:
		return n * 4, nil
	case F16, BF16:
		return n * 2, nil
	case Q4K:
		if inner%256 != 0 {
			return 0, fmt.Errorf("Q4_K rows must be a multiple of 256 weights; innermost dimension is %d", inner)
		}
		return n / 256 * 144, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (want Q4_K, F16, BF16 or F32)", string(d))
}

// FieldError is a manifest that breaks a rule; Field names where, e.g.
// `tensors["model.norm.weight"].shard`.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "manifest: " + e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Decode parses and validates a manifest. It refuses unknown top-level and
// tensor fields, trailing data, more than MaxManifestBytes, and anything
// Validate refuses.
func Decode(b []byte) (*Manifest, error) {
	if len(b) > MaxManifestBytes {
		return nil, fieldErr("(file)", "%d bytes (limit %d)", len(b), MaxManifestBytes)
	}
	// What the decoder allocates is bounded by the file's size; the counts
	// are checked by Validate before anything is allocated from them.
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fieldErr("(json)", "%v", err)
	}
	if dec.More() {
		return nil, fieldErr("(json)", "trailing data after the manifest")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Encode returns the manifest as indented JSON (map keys sorted, so the
// same manifest always has the same bytes and CID).
func (m *Manifest) Encode() ([]byte, error) {
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Validate checks every rule of FORMAT.md. The error is a *FieldError
// naming the first field that breaks one.
func (m *Manifest) Validate() error {
	if m.HashAlgorithm != "blake3" {
		return fieldErr("hashAlgorithm", "%q (want \"blake3\")", m.HashAlgorithm)
	}
	if m.ModelID == "" {
		return fieldErr("modelId", "empty")
	}
	if err := m.Config.validate(); err != nil {
		return err
	}
	if m.Tokenizer != nil {
		if err := m.Tokenizer.validate(); err != nil {
			return err
		}
	}
	if len(m.Shards) == 0 || len(m.Shards) > MaxShards {
		return fieldErr("shards", "%d shards (want 1 to %d)", len(m.Shards), MaxShards)
	}
	var total int64
	names := make(map[string]bool, len(m.Shards))
	for i, s := range m.Shards {
		f := fmt.Sprintf("shards[%d]", i)
		if s.Size <= 0 || s.Size > ShardSize {
			return fieldErr(f+".size", "%d (want 1 to %d)", s.Size, ShardSize)
		}
		if d, err := hex.DecodeString(s.Hash); err != nil || len(d) != 32 {
			return fieldErr(f+".hash", "%q is not 32 bytes of hex", s.Hash)
		}
		if !validFilename(s.Filename) {
			return fieldErr(f+".filename", "%q (want a plain file name)", s.Filename)
		}
		if names[s.Filename] {
			return fieldErr(f+".filename", "%q appears twice", s.Filename)
		}
		names[s.Filename] = true
		total += s.Size
	}
	if total != m.TotalSize {
		return fieldErr("totalSize", "%d, but the shards add up to %d", m.TotalSize, total)
	}
	if len(m.Tensors) == 0 || len(m.Tensors) > MaxTensors {
		return fieldErr("tensors", "%d tensors (want 1 to %d)", len(m.Tensors), MaxTensors)
	}
	starts := m.shardStarts()
	type span struct {
		start, end int64
		name       string
	}
	spans := make([]span, 0, len(m.Tensors))
	for name, t := range m.Tensors {
		f := fmt.Sprintf("tensors[%q]", name)
		if t == nil {
			return fieldErr(f, "null")
		}
		if err := t.check(f); err != nil {
			return err
		}
		if t.Shard < 0 || t.Shard >= len(m.Shards) {
			return fieldErr(f+".shard", "shard %d is missing (the manifest has %d)", t.Shard, len(m.Shards))
		}
		if t.Offset < 0 || t.Offset >= m.Shards[t.Shard].Size {
			return fieldErr(f+".offset", "%d is outside its shard %d of %d bytes", t.Offset, t.Shard, m.Shards[t.Shard].Size)
		}
		start := starts[t.Shard] + t.Offset
		if start+t.Size > total {
			return fieldErr(f+".size", "tensor ends at byte %d of the model, past its last shard (%d bytes)", start+t.Size, total)
		}
		if end := start + t.Size; end > starts[t.Shard]+m.Shards[t.Shard].Size && t.Size <= ShardSize {
			return fieldErr(f+".size", "tensor of %d bytes runs past its shard %d (only a tensor larger than a shard may span shards)", t.Size, t.Shard)
		}
		spans = append(spans, span{start, start + t.Size, name})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].end {
			return fieldErr(fmt.Sprintf("tensors[%q]", spans[i].name), "overlaps tensor %q", spans[i-1].name)
		}
	}
	return m.validateExperts(starts)
}

func validFilename(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 255 {
		return false
	}
	for _, r := range s {
		if r == '/' || r == '\\' || r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// shardStarts returns each shard's first byte in the model's byte space
// (the shards laid end to end).
func (m *Manifest) shardStarts() []int64 {
	starts := make([]int64, len(m.Shards)+1)
	for i, s := range m.Shards {
		starts[i+1] = starts[i] + s.Size
	}
	return starts
}

func (t *Tensor) check(f string) error {
	if !t.DType.Known() {
		return fieldErr(f+".dtype", "unknown dtype %q (want Q4_K, F16, BF16 or F32)", string(t.DType))
	}
	if len(t.Shape) == 0 || len(t.Shape) > MaxDims {
		return fieldErr(f+".shape", "%d dimensions (want 1 to %d)", len(t.Shape), MaxDims)
	}
	n := int64(1)
	for _, d := range t.Shape {
		if d <= 0 || d > MaxDim {
			return fieldErr(f+".shape", "dimension %d (want 1 to %d)", d, int64(MaxDim))
		}
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > math.MaxInt64/4 {
			return fieldErr(f+".shape", "%v has too many elements", t.Shape)
		}
		n = int64(lo)
	}
	want, err := t.DType.Bytes(n, t.Shape[len(t.Shape)-1])
	if err != nil {
		return fieldErr(f+".shape", "%v", err)
	}
	if t.Size != want {
		return fieldErr(f+".size", "%d bytes, but shape %v of %s is %d bytes", t.Size, t.Shape, t.DType, want)
	}
	return nil
}

// Elements returns the number of elements of t.
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

func (c *Config) validate() error {
	pos := func(name string, v, hi int) error {
		if v <= 0 || v > hi {
			return fieldErr("config."+name, "%d (want 1 to %d)", v, hi)
		}
		return nil
	}
	for _, e := range []error{
		pos("hidden_size", c.HiddenSize, 1<<20),
		pos("num_hidden_layers", c.NumHiddenLayers, MaxLayers),
		pos("num_attention_heads", c.NumAttentionHeads, 4096),
		pos("num_key_value_heads", c.NumKeyValueHeads, 4096),
		pos("intermediate_size", c.IntermediateSize, 1<<22),
		pos("vocab_size", c.VocabSize, 1<<24),
	} {
		if e != nil {
			return e
		}
	}
	if c.MoEIntermediateSize < 0 || c.MoEIntermediateSize > 1<<22 { // 0: the experts are intermediate_size wide
		return fieldErr("config.moe_intermediate_size", "%d (want 0 to %d)", c.MoEIntermediateSize, 1<<22)
	}
	if c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fieldErr("config.num_key_value_heads", "%d does not divide num_attention_heads %d", c.NumKeyValueHeads, c.NumAttentionHeads)
	}
	if c.NumExperts != 0 && c.NumRoutedExperts != 0 {
		return fieldErr("config.n_routed_experts", "set together with num_local_experts")
	}
	if e := c.Experts(); e != 0 {
		if err := pos("num_local_experts", e, MaxExperts); err != nil {
			return err
		}
		if err := pos("num_experts_per_tok", c.NumExpertsPerTok, e); err != nil {
			return err
		}
	}
	if c.FirstKDenseReplace < 0 || c.FirstKDenseReplace > c.NumHiddenLayers {
		return fieldErr("config.first_k_dense_replace", "%d (want 0 to num_hidden_layers)", c.FirstKDenseReplace)
	}
	if c.NumSharedExperts < 0 || c.NumSharedExperts > 64 {
		return fieldErr("config.n_shared_experts", "%d (want 0 to 64)", c.NumSharedExperts)
	}
	if !(c.RMSNormEps > 0 && c.RMSNormEps < 1) {
		return fieldErr("config.rms_norm_eps", "%g (want between 0 and 1)", c.RMSNormEps)
	}
	return nil
}

func (m *Manifest) validateExperts(starts []int64) error {
	if len(m.Experts) > MaxLayers*MaxExperts {
		return fieldErr("experts", "%d entries (limit %d)", len(m.Experts), MaxLayers*MaxExperts)
	}
	index := make(map[[2]int]int, len(m.Experts))
	for i := range m.Experts {
		e := &m.Experts[i]
		f := fmt.Sprintf("experts[%d]", i)
		if e.Layer < 0 || e.Layer >= m.Config.NumHiddenLayers || !m.Config.IsMoE(e.Layer) {
			return fieldErr(f+".layer", "%d is not an MoE layer of this model", e.Layer)
		}
		if e.Index < 0 || e.Index >= m.Config.Experts() {
			return fieldErr(f+".expert", "%d (the model has %d experts per layer)", e.Index, m.Config.Experts())
		}
		if _, dup := index[[2]int{e.Layer, e.Index}]; dup {
			return fieldErr(f, "layer %d expert %d appears twice", e.Layer, e.Index)
		}
		index[[2]int{e.Layer, e.Index}] = i
		if len(e.Tensors) == 0 || len(e.Tensors) > 8 {
			return fieldErr(f+".tensors", "%d tensors (want 1 to 8)", len(e.Tensors))
		}
		if e.Shard < 0 || e.Shard >= len(m.Shards) {
			return fieldErr(f+".shard", "shard %d is missing", e.Shard)
		}
		if e.Offset < 0 || e.Offset >= m.Shards[e.Shard].Size || e.Size <= 0 {
			return fieldErr(f+".offset", "range [%d, +%d) is outside shard %d", e.Offset, e.Size, e.Shard)
		}
		// The tensors must fill the range exactly: adjacent, no gaps.
		start := starts[e.Shard] + e.Offset
		ts := make([]*Tensor, 0, len(e.Tensors))
		for _, name := range e.Tensors {
			t, ok := m.Tensors[name]
			if !ok {
				return fieldErr(f+".tensors", "tensor %q is not in the manifest", name)
			}
			ts = append(ts, t)
		}
		slices.SortFunc(ts, func(a, b *Tensor) int { return int(starts[a.Shard] + a.Offset - starts[b.Shard] - b.Offset) })
		at := start
		for _, t := range ts {
			if starts[t.Shard]+t.Offset != at {
				return fieldErr(f+".tensors", "the expert's tensors are not one contiguous range from shard %d offset %d", e.Shard, e.Offset)
			}
			at += t.Size
		}
		if at-start != e.Size {
			return fieldErr(f+".size", "%d, but its tensors fill %d bytes", e.Size, at-start)
		}
		end := starts[e.Shard] + e.Offset + e.Size
		if e.Size <= ShardSize {
			if end > starts[e.Shard+1] {
				return fieldErr(f, "expert of %d bytes is split across shards %d and %d (an expert that fits in a shard must lie inside one)", e.Size, e.Shard, e.Shard+1)
			}
		} else if e.Offset != 0 {
			return fieldErr(f, "expert of %d bytes is larger than a shard and must start at a shard's start", e.Size)
		}
	}
	m.expertAt = index
	return nil
}

// BlobRange is a byte range of one shard: what the tiers cache and the
// swarm's range fetch deal in.
type BlobRange struct {
	Shard  int
	Offset int64
	Size   int64
}

// Ranges returns the shard ranges that hold [shard:offset, +size) of the
// model's byte space: one range, or several for bytes that span shards.
func (m *Manifest) Ranges(shard int, offset, size int64) []BlobRange {
	var out []BlobRange
	for size > 0 && shard < len(m.Shards) {
		n := min(size, m.Shards[shard].Size-offset)
		out = append(out, BlobRange{shard, offset, n})
		size -= n
		shard, offset = shard+1, 0
	}
	return out
}

// Expert returns the index entry of layer l's expert e: from the index
// Validate built (the decode loops ask for every chosen expert of every
// token, and a DeepSeek-V3 manifest lists 14848), or, for a manifest not
// validated or changed since, by a scan.
func (m *Manifest) Expert(l, e int) (*Expert, bool) {
	if i, ok := m.expertAt[[2]int{l, e}]; ok && i < len(m.Experts) && m.Experts[i].Layer == l && m.Experts[i].Index == e {
		return &m.Experts[i], true
	}
	for i := range m.Experts {
		if m.Experts[i].Layer == l && m.Experts[i].Index == e {
			return &m.Experts[i], true
		}
	}
	return nil, false
}
