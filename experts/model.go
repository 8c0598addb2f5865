package experts

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ref"
	"github.com/rdrr/peer/tiers"
	"github.com/x448/float16"
)

// RefModel is a float64 CPU reference of an RDRR model's decode step,
// built from gpu/ref's operations: embedding, per layer RMSNorm, GQA
// attention with RoPE and a KV cache, the router and top-k (Mixtral:
// softmax over the top-k; DeepSeek-V3: sigmoid, group-limited top-k, plus
// the shared experts; dense first layers), SwiGLU experts and their
// weighted sum; final norm and LM head. Dense weights are read once and
// kept; experts are paged through a tiers cache at the RAM level, so it
// exercises the same paging a GPU decode does. It is the ground truth of
// the GPU decode loop and a generator in its own right for small models.
type RefModel struct {
	m     *Manifest
	cache *tiers.Cache
	dense map[string][]float64
	freqs []float64
	// KV cache per layer: [pos][kvHeads][headDim] keys and values.
	k, v [][]float64
	pos  int
	// Trace, if not nil, is told each token (tiers' recorder).
	Trace *tiers.TraceRecorder
	// Routes counts how often each (layer, expert) was chosen.
	Routes map[[2]int]int
	// QuantizedX has the routed experts' products read their x as the
	// GPU engine's quantized products do (ref.QuantizeX of the FFN's norm
	// and of SwiGLU's output), QuantizedQKV the q k v products (of the
	// attention's norm), QuantizedO the o product (of the attention's
	// output) and QuantizedHead the LM head (of the final norm): the
	// reference of that arithmetic, not of the model's. The routers read
	// float x.
	QuantizedX, QuantizedQKV, QuantizedO, QuantizedHead bool
	// Follow, if not nil, returns the experts another engine chose for
	// MoE layer l at this step (nil: not known). Where that choice
	// differs from the reference's in experts whose selection scores all
	// lie within FollowTie (of the largest score's magnitude) of the
	// reference's k-th, a near-tie that rounding may turn either way, the
	// reference takes it and counts it in Followed; any other difference
	// fails the step. The engine's arithmetic is then checked along its
	// own path through such ties rather than diverging from the
	// reference at the first one.
	Follow    func(l int) []int
	FollowTie float64
	Followed  int
}

// NewRefModel reads m's dense tensors through cache (RAM level) and keeps
// them; experts are read through cache on each use.
func NewRefModel(ctx context.Context, m *Manifest, cache *tiers.Cache) (*RefModel, error) {
	c := &m.Config
	if c.HeadDimension()%2 != 0 {
		return nil, fmt.Errorf("experts: head dim %d is odd", c.HeadDimension())
	}
	rm := &RefModel{m: m, cache: cache, dense: map[string][]float64{}, Routes: map[[2]int]int{},
		freqs: ref.RopeFreqs(c.RopeTheta, c.HeadDimension()),
		k:     make([][]float64, c.NumHiddenLayers), v: make([][]float64, c.NumHiddenLayers)}
	inExpert := map[string]bool{}
	for _, e := range m.Experts {
		for _, t := range e.Tensors {
			inExpert[t] = true
		}
	}
	for name := range m.Tensors {
		if inExpert[name] {
			continue
		}
		w, err := rm.read(ctx, name)
		if err != nil {
			return nil, err
		}
		rm.dense[name] = w
	}
	return rm, nil
}

// read returns tensor name's values, widened to float64, its bytes read
// (verified) through the cache.
func (rm *RefModel) read(ctx context.Context, name string) ([]float64, error) {
	t, ok := rm.m.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("experts: the model has no tensor %s", name)
	}
	raw := make([]byte, 0, t.Size)
	for _, r := range rm.m.Ranges(t.Shard, t.Offset, t.Size) {
		s := &rm.m.Shards[r.Shard]
		l, err := rm.cache.Get(ctx, tiers.Key{Blob: s.CID(), Size: s.Size, Off: r.Offset, Len: r.Size}, tiers.RAM)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
		raw = append(raw, l.Bytes()...)
		l.Release()
	}
	return widen(raw, t)
}

// readExpert pages one expert in as what the cache deals in, its byte
// range (one key, or one per shard for an expert larger than a shard),
// and returns its tensors widened.
func (rm *RefModel) readExpert(ctx context.Context, ex *Expert) (map[string][]float64, error) {
	raw := make([]byte, 0, ex.Size)
	for _, r := range rm.m.Ranges(ex.Shard, ex.Offset, ex.Size) {
		s := &rm.m.Shards[r.Shard]
		l, err := rm.cache.Get(ctx, tiers.Key{Blob: s.CID(), Size: s.Size, Off: r.Offset, Len: r.Size}, tiers.RAM)
		if err != nil {
			return nil, fmt.Errorf("layer %d expert %d: %w", ex.Layer, ex.Index, err)
		}
		raw = append(raw, l.Bytes()...)
		l.Release()
	}
	starts := rm.m.shardStarts()
	base := starts[ex.Shard] + ex.Offset
	out := make(map[string][]float64, len(ex.Tensors))
	for _, name := range ex.Tensors {
		t := rm.m.Tensors[name]
		at := starts[t.Shard] + t.Offset - base
		v, err := widen(raw[at:at+t.Size], t)
		if err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, nil
}

// widen decodes a tensor's bytes to float64.
func widen(raw []byte, t *Tensor) ([]float64, error) {
	n := t.Elements()
	switch t.DType {
	case Q4K:
		return ref.Q4K(raw)
	case F32:
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		}
		return out, nil
	case F16:
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(float16.Frombits(binary.LittleEndian.Uint16(raw[2*i:])).Float32())
		}
		return out, nil
	case BF16:
		out := make([]float64, n)
		for i := range out {
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(raw[2*i:])) << 16))
		}
		return out, nil
	}
	return nil, fmt.Errorf("experts: dtype %s", t.DType)
}

func (rm *RefModel) w(name string) []float64 { return rm.dense[name] }

// matvec is y = W x for a [rows, cols] tensor W.
func matvec(w, x []float64, rows, cols int) []float64 {
	y, _ := ref.MatMul(w, x, rows, cols, 1)
	return y
}

// Step runs one token through the model at the next position and returns
// the logits.
func (rm *RefModel) Step(ctx context.Context, token int) ([]float64, error) {
	c := &rm.m.Config
	h, hd := c.HiddenSize, c.HeadDimension()
	nq, nkv := c.NumAttentionHeads, c.NumKeyValueHeads
	if token < 0 || token >= c.VocabSize {
		return nil, fmt.Errorf("experts: token %d outside the vocabulary of %d", token, c.VocabSize)
	}
	x := append([]float64(nil), rm.w("model.embed_tokens.weight")[token*h:(token+1)*h]...)
	for l := 0; l < c.NumHiddenLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		xn := ref.RMSNorm(x, rm.w(p+"input_layernorm.weight"), 1, h, c.RMSNormEps)
		if rm.QuantizedQKV {
			xn = ref.QuantizeX(xn)
		}
		q := matvec(rm.w(p+"self_attn.q_proj.weight"), xn, nq*hd, h)
		k := matvec(rm.w(p+"self_attn.k_proj.weight"), xn, nkv*hd, h)
		v := matvec(rm.w(p+"self_attn.v_proj.weight"), xn, nkv*hd, h)
		q = ref.Rope(q, 1, nq, hd, hd, rm.pos, rm.freqs, abi.RopeNeoX)
		k = ref.Rope(k, 1, nkv, hd, hd, rm.pos, rm.freqs, abi.RopeNeoX)
		rm.k[l] = append(rm.k[l], k...)
		rm.v[l] = append(rm.v[l], v...)
		att := ref.Attention(q, rm.k[l], rm.v[l], nq, nkv, hd, rm.pos+1, 1/math.Sqrt(float64(hd)))
		if rm.QuantizedO {
			att = ref.QuantizeX(att)
		}
		o := matvec(rm.w(p+"self_attn.o_proj.weight"), att, h, nq*hd)
		for i := range x {
			x[i] += o[i]
		}
		xn = ref.RMSNorm(x, rm.w(p+"post_attention_layernorm.weight"), 1, h, c.RMSNormEps)
		var y []float64
		var err error
		if c.IsMoE(l) {
			y, err = rm.moe(ctx, l, xn)
		} else {
			y = rm.ffn(p+"mlp.", xn, c.IntermediateSize)
		}
		if err != nil {
			return nil, err
		}
		for i := range x {
			x[i] += y[i]
		}
	}
	rm.pos++
	xn := ref.RMSNorm(x, rm.w("model.norm.weight"), 1, h, c.RMSNormEps)
	if rm.QuantizedHead {
		xn = ref.QuantizeX(xn)
	}
	return matvec(rm.w("lm_head.weight"), xn, c.VocabSize, h), nil
}

// ffn is a dense SwiGLU FFN of dense weights under prefix.
func (rm *RefModel) ffn(prefix string, x []float64, ffn int) []float64 {
	h := len(x)
	g := matvec(rm.w(prefix+"gate_proj.weight"), x, ffn, h)
	u := matvec(rm.w(prefix+"up_proj.weight"), x, ffn, h)
	return matvec(rm.w(prefix+"down_proj.weight"), ref.SwiGLU(g, u), h, ffn)
}

// refRoute is the routing of c's MoE layers as the reference runs it:
// Mixtral's softmax over the top-k, or DeepSeek-V3's sigmoid with the
// group limit.
func (c *Config) refRoute() ref.Route {
	if c.ScoringFunc == "sigmoid" {
		return ref.Route{Mode: abi.RouteSigmoidTopK, K: c.NumExpertsPerTok, Groups: c.NGroup, TopKGroup: c.TopKGroup}
	}
	return ref.Route{Mode: abi.RouteSoftmaxTopK, K: c.NumExpertsPerTok}
}

// sameSet reports whether a and b hold the same experts.
func sameSet(a, b []int) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

// nearTie returns nil if choices want and got (of the same length) of
// routing r over one token's logits differ only in experts whose
// selection scores (ref.RouteScores) lie within tie times the largest
// score magnitude of want's lowest score, the boundary of the choice, or,
// with a group limit, whose groups' scores (the sum of their two best)
// lie within tie of the kept groups' boundary: a group kept in one
// choice and not the other changes experts far from the boundary.
func nearTie(logits []float64, r ref.Route, want, got []int, tie float64) error {
	if len(want) != len(got) {
		return fmt.Errorf("%d experts chosen, not %d", len(got), len(want))
	}
	scores := ref.RouteScores(logits, r)
	scale, edge := 0.0, math.Inf(1)
	for _, v := range scores {
		scale = math.Max(scale, math.Abs(v))
	}
	for _, e := range want {
		edge = math.Min(edge, scores[e])
	}
	groupTie := func(int) bool { return false }
	if r.Mode == abi.RouteSigmoidTopK && r.Groups > 1 && r.TopKGroup < r.Groups {
		gs := len(scores) / r.Groups
		gscore := ref.GroupScores(scores, r.Groups)
		gscale := 0.0
		for _, v := range gscore {
			gscale = math.Max(gscale, math.Abs(v))
		}
		sorted := slices.SortedFunc(slices.Values(gscore), func(a, b float64) int { return cmp.Compare(b, a) })
		gedge := sorted[r.TopKGroup-1] // the last group kept
		groupTie = func(e int) bool { return math.Abs(gscore[e/gs]-gedge) <= tie*gscale }
	}
	near := func(e int) bool { return math.Abs(scores[e]-edge) <= tie*scale || groupTie(e) }
	for i, e := range got {
		if e < 0 || e >= len(scores) || slices.Contains(got[:i], e) {
			return fmt.Errorf("expert %d of %d, or twice", e, len(scores))
		}
		if !slices.Contains(want, e) && !near(e) {
			return fmt.Errorf("expert %d scores %g, %g from the choice's lowest (tie: %g)", e, scores[e], math.Abs(scores[e]-edge), tie*scale)
		}
	}
	for _, e := range want {
		if !slices.Contains(got, e) && !near(e) {
			return fmt.Errorf("expert %d left out scores %g, %g from the choice's lowest (tie: %g)", e, scores[e], math.Abs(scores[e]-edge), tie*scale)
		}
	}
	return nil
}

// moe routes x to the layer's experts, runs each (paged through the
// cache) and returns their weighted sum, plus the shared experts.
func (rm *RefModel) moe(ctx context.Context, l int, x []float64) ([]float64, error) {
	c := &rm.m.Config
	h, ne := c.HiddenSize, c.Experts()
	p := fmt.Sprintf("model.layers.%d.mlp.", l)
	logits := matvec(rm.w(p+"gate.weight"), x, ne, h)
	route := c.refRoute()
	ids, ws := ref.TopK(logits, 1, ne, route)
	if rm.Follow != nil {
		if got := rm.Follow(l); got != nil && !sameSet(got, ids) {
			if err := nearTie(logits, route, ids, got, rm.FollowTie); err != nil {
				return nil, fmt.Errorf("experts: layer %d: the engine chose experts %v, the reference %v: %w", l, got, ids, err)
			}
			ids, ws = got, ref.RouteWeights(logits, got, route)
			rm.Followed++
		}
	}
	out := make([]float64, h)
	ffn := c.ExpertFFN()
	for i, e := range ids {
		rm.Routes[[2]int{l, e}]++
		ex, ok := rm.m.Expert(l, e)
		if !ok {
			return nil, fmt.Errorf("experts: layer %d expert %d is not in the manifest", l, e)
		}
		w, err := rm.readExpert(ctx, ex)
		if err != nil {
			return nil, err
		}
		pre := fmt.Sprintf("%sexperts.%d.", p, e)
		xe, act := x, func(v []float64) []float64 { return v }
		if rm.QuantizedX {
			xe, act = ref.QuantizeX(x), ref.QuantizeX
		}
		g := matvec(w[pre+"gate_proj.weight"], xe, ffn, h)
		u := matvec(w[pre+"up_proj.weight"], xe, ffn, h)
		y := matvec(w[pre+"down_proj.weight"], act(ref.SwiGLU(g, u)), h, ffn)
		for j := range out {
			out[j] += ws[i] * y[j]
		}
	}
	if c.NumSharedExperts > 0 {
		y := rm.ffn(p+"shared_experts.", x, c.ExpertFFN()*c.NumSharedExperts)
		for j := range out {
			out[j] += y[j]
		}
	}
	return out, nil
}

// Sampling chooses the next token from logits.
type Sampling struct {
	Temperature float64 // 0: greedy
	TopP        float64 // 0 or 1: no nucleus cut
	Seed        uint64
}

// Generate feeds prompt then samples up to maxTokens tokens, calling emit
// with each generated one; it stops early at the tokenizer's end token.
func (rm *RefModel) Generate(ctx context.Context, prompt []int, maxTokens int, s Sampling, emit func(int)) ([]int, error) {
	return decode(ctx, rm.m, rm.Trace, prompt, maxTokens, s, emit, func(ctx context.Context, tok int, d *draw) (int, error) {
		logits, err := rm.Step(ctx, tok)
		if err != nil || d == nil {
			return 0, err
		}
		return d.pick(logits), nil
	})
}

// A draw is how one token is chosen from a step's logits: greedy at
// temperature 0, else top-p with the uniform u that the seeded stream gave
// for this token.
type draw struct {
	temperature, topP, u float64
}

// pick applies d to logits on the host.
func (d *draw) pick(logits []float64) int {
	if d.temperature <= 0 {
		return ref.Argmax(logits)
	}
	tok, _ := ref.TopP(logits, d.temperature, d.topP, d.u)
	return tok
}

// decode is the generation loop of both engines: the prompt through step,
// then a token sampled after each step (greedy at temperature 0, else
// top-p with a seeded draw, one draw a sampled token in order), each fed
// back, until maxTokens or the end token. step runs one token and, given
// a draw, returns the next token chosen from its logits (an engine may
// choose on its own device: the draws are the same).
func decode(ctx context.Context, m *Manifest, trace *tiers.TraceRecorder, prompt []int, maxTokens int, s Sampling, emit func(int), step func(ctx context.Context, tok int, d *draw) (int, error)) ([]int, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("experts: empty prompt")
	}
	next := draws(s)
	var out []int
	if maxTokens <= 0 {
		// Only the prompt: no token is chosen.
		for i, t := range prompt {
			if trace != nil {
				trace.SetToken(i)
			}
			if _, err := step(ctx, t, nil); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	var tok int
	for i, t := range prompt {
		if trace != nil {
			trace.SetToken(i)
		}
		var d *draw
		if i == len(prompt)-1 {
			d = next()
		}
		var err error
		if tok, err = step(ctx, t, d); err != nil {
			return nil, err
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = append(out, tok)
		if emit != nil {
			emit(tok)
		}
		if tk := m.Tokenizer; (tk != nil && tok == tk.EOS) || len(out) == maxTokens {
			break
		}
		if trace != nil {
			trace.SetToken(len(prompt) + len(out) - 1)
		}
		var err error
		if tok, err = step(ctx, tok, next()); err != nil {
			return out, err
		}
	}
	return out, nil
}

// draws returns a function that makes the draw of each sampled token in
// turn: s's temperature and top-p, and a uniform from s's seed when the
// temperature is above 0.
func draws(s Sampling) func() *draw {
	rng := newSplitmix(s.Seed)
	topP := s.TopP
	if topP <= 0 || topP > 1 {
		topP = 1
	}
	return func() *draw {
		d := &draw{temperature: s.Temperature, topP: topP}
		if s.Temperature > 0 {
			d.u = unit(rng.next())
		}
		return d
	}
}

type splitmixRNG struct{ s uint64 }

func newSplitmix(seed uint64) *splitmixRNG { return &splitmixRNG{seed} }
func (r *splitmixRNG) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return splitmix(r.s)
}

// ByteTokens encodes text as byte tokens (synthetic models' tokenizer:
// ids 0-255 are the bytes).
func ByteTokens(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// TokenText prints a token of a byte-level model: its byte, or <id>.
func TokenText(t int) string {
	if t >= 0x20 && t < 0x7f {
		return string(rune(t))
	}
	return fmt.Sprintf("<%d>", t)
}
