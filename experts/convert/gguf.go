package convert

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"

	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/experts/gguf"
)

// ggufNames maps llama.cpp's tensor names to RDRR (HuggingFace) names.
var ggufNames = []struct {
	re   *regexp.Regexp
	name string // with $1 for the layer
}{
	{regexp.MustCompile(`^token_embd\.weight$`), "model.embed_tokens.weight"},
	{regexp.MustCompile(`^output_norm\.weight$`), "model.norm.weight"},
	{regexp.MustCompile(`^output\.weight$`), "lm_head.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_norm\.weight$`), "model.layers.$1.input_layernorm.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_q\.weight$`), "model.layers.$1.self_attn.q_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_k\.weight$`), "model.layers.$1.self_attn.k_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_v\.weight$`), "model.layers.$1.self_attn.v_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_output\.weight$`), "model.layers.$1.self_attn.o_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.ffn_norm\.weight$`), "model.layers.$1.post_attention_layernorm.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.ffn_gate_inp\.weight$`), "model.layers.$1.mlp.gate.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.exp_probs_b\.bias$`), "model.layers.$1.mlp.gate.e_score_correction_bias"},
	// DeepSeek's multi-head latent attention.
	{regexp.MustCompile(`^blk\.(\d+)\.attn_q_a\.weight$`), "model.layers.$1.self_attn.q_a_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_q_a_norm\.weight$`), "model.layers.$1.self_attn.q_a_layernorm.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_q_b\.weight$`), "model.layers.$1.self_attn.q_b_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_kv_a_mqa\.weight$`), "model.layers.$1.self_attn.kv_a_proj_with_mqa.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_kv_a_norm\.weight$`), "model.layers.$1.self_attn.kv_a_layernorm.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.attn_kv_b\.weight$`), "model.layers.$1.self_attn.kv_b_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.ffn_(gate|up|down)_shexp\.weight$`), "model.layers.$1.mlp.shared_experts.${2}_proj.weight"},
	{regexp.MustCompile(`^blk\.(\d+)\.ffn_(gate|up|down)\.weight$`), "model.layers.$1.mlp.${2}_proj.weight"},
}

var (
	stackedRe   = regexp.MustCompile(`^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$`)
	perExpertRe = regexp.MustCompile(`^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$`)
	partIndex   = map[string]int{"gate": 0, "up": 1, "down": 2}
	partName    = [3]string{"gate_proj", "up_proj", "down_proj"}
)

func expertName(l, e, part int) string {
	return fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", l, e, partName[part])
}

// openGGUF reads a GGUF file's config, tokenizer and tensors.
func openGGUF(path string) (*experts.Manifest, []*tensor, io.Closer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, nil, err
	}
	g, err := gguf.Read(f, fi.Size())
	if err != nil {
		f.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	m, err := ggufManifest(g)
	if err != nil {
		f.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	ts, err := ggufTensors(g)
	if err != nil {
		f.Close()
		return nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, ts, f, nil
}

func ggufManifest(g *gguf.File) (*experts.Manifest, error) {
	arch, ok := g.String("general.architecture")
	if !ok {
		return nil, fmt.Errorf("%w: no general.architecture", ErrUnsupported)
	}
	u := func(key string) int {
		v, _ := g.Uint(arch + "." + key)
		return int(min(v, 1<<31))
	}
	fl := func(key string) float64 {
		v, _ := g.Float(arch + "." + key)
		return v
	}
	c := experts.Config{
		ModelType:          arch,
		HiddenSize:         u("embedding_length"),
		NumHiddenLayers:    u("block_count"),
		NumAttentionHeads:  u("attention.head_count"),
		NumKeyValueHeads:   u("attention.head_count_kv"),
		HeadDim:            u("attention.key_length"),
		IntermediateSize:   u("feed_forward_length"),
		NumExpertsPerTok:   u("expert_used_count"),
		NumSharedExperts:   u("expert_shared_count"),
		FirstKDenseReplace: u("leading_dense_block_count"),
		MaxPositions:       u("context_length"),
		RMSNormEps:         fl("attention.layer_norm_rms_epsilon"),
		RopeTheta:          fl("rope.freq_base"),
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if n := u("expert_count"); n > 0 {
		c.NumExperts = n
		c.MoEIntermediateSize = u("expert_feed_forward_length")
	}
	m := &experts.Manifest{ModelID: modelID(g), Version: 1, Quantization: "Q4_K", HashAlgorithm: "blake3", Config: c}
	tk, err := g.Tokenizer()
	if err != nil {
		return nil, err
	}
	if tk != nil {
		m.Tokenizer = &experts.Tokenizer{Model: tk.Model, Pre: tk.Pre, Tokens: tk.Tokens, Scores: tk.Scores, Types: tk.Types,
			Merges: tk.Merges, BOS: tk.BOS, EOS: tk.EOS, AddBOS: tk.AddBOS, AddEOS: tk.AddEOS, UNK: optionalID(tk.UNK), PAD: optionalID(tk.PAD),
			AddSpacePrefix: tk.AddSpacePrefix, LStrip: tk.LStrip, RStrip: tk.RStrip}
		m.Config.VocabSize = len(tk.Tokens)
	}
	if v := u("vocab_size"); v > 0 {
		m.Config.VocabSize = v
	}
	return m, nil
}

// optionalID is a special token id for the manifest: nil for none (-1).
func optionalID(id int) *int {
	if id < 0 {
		return nil
	}
	return &id
}

func modelID(g *gguf.File) string {
	if s, ok := g.String("general.name"); ok && s != "" {
		return s
	}
	return "gguf"
}

func ggufDType(t gguf.TensorType) (experts.DType, error) {
	switch t {
	case gguf.F32:
		return experts.F32, nil
	case gguf.F16:
		return experts.F16, nil
	case gguf.BF16:
		return experts.BF16, nil
	case gguf.Q4_K:
		return experts.Q4K, nil
	}
	return "", fmt.Errorf("%w: tensor type %s (F32, F16, BF16 and Q4_K are)", ErrUnsupported, t)
}

// shapeOf reverses GGML dims (innermost first) into a shape.
func shapeOf(dims []uint64) []int64 {
	s := make([]int64, len(dims))
	for i, d := range dims {
		s[len(dims)-1-i] = int64(d)
	}
	return s
}

func ggufTensors(g *gguf.File) ([]*tensor, error) {
	var out []*tensor
	for _, gt := range g.Tensors {
		dt, err := ggufDType(gt.Type)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", gt.Name, err)
		}
		if mm := stackedRe.FindStringSubmatch(gt.Name); mm != nil {
			// [experts, rows, cols]: one slice per expert.
			if len(gt.Dims) != 3 {
				return nil, fmt.Errorf("tensor %s: %d dims (want 3: cols, rows, experts)", gt.Name, len(gt.Dims))
			}
			ne := int64(gt.Dims[2])
			if ne > experts.MaxExperts {
				return nil, fmt.Errorf("tensor %s: %d experts (limit %d)", gt.Name, ne, experts.MaxExperts)
			}
			per := int64(gt.Size) / ne
			for e := int64(0); e < ne; e++ {
				t := &tensor{dtype: dt, shape: shapeOf(gt.Dims[:2]), src: io.NewSectionReader(gt.Section(), e*per, per)}
				if err := t.setExpert(gt.Name, mm[1], strconv.FormatInt(e, 10), partIndex[mm[2]]); err != nil {
					return nil, err
				}
				out = append(out, t)
			}
			continue
		}
		t := &tensor{name: gt.Name, dtype: dt, shape: shapeOf(gt.Dims), src: gt.Section(), layer: -1}
		if mm := perExpertRe.FindStringSubmatch(gt.Name); mm != nil {
			if err := t.setExpert(gt.Name, mm[1], mm[3], partIndex[mm[2]]); err != nil {
				return nil, err
			}
		} else {
			for _, r := range ggufNames {
				if r.re.MatchString(gt.Name) {
					t.name = r.re.ReplaceAllString(gt.Name, r.name)
					break
				}
			}
		}
		out = append(out, t)
	}
	return out, nil
}
