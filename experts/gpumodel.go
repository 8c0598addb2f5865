package experts

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
	"github.com/rdrr/peer/tiers"
)

// GPUModel is the decode step on the GPU: dense weights resident in VRAM,
// each layer's selected experts paged into the slots of a tiers VRAM arena
// (one slot per expert matrix: a matrix lies inside one shard even when
// its expert does not) and run by one Q4KMatVecGroup dispatch per matrix. It checks against
// RefModel (see gpumodel_test.go). Built for Mixtral-style models (every
// layer MoE, softmax top-k, no shared experts) with Q4_K matrices and F32
// norms and routers; other layouts are refused by name.
type GPUModel struct {
	m     *Manifest
	d     *gpu.Device
	k     *ops.Kernels
	cache *tiers.Cache
	arena *tiers.GPUArena
	dense map[string]*gpu.Buffer
	buf   map[string]*gpu.Buffer
	qkv   []*gpu.Buffer // per layer: Wq, Wk and Wv stacked (one product), when all Q4_K
	kc    []*gpu.Buffer // per layer [MaxPos][kvHeads][headDim] f32
	vc    []*gpu.Buffer
	pos   int
	// MaxPos bounds the positions (KV cache length).
	MaxPos int
	// Trace, if not nil, is told each token.
	Trace *tiers.TraceRecorder
	// Prefetch turns on next-layer prefetch: while layer L runs, layer
	// L+1's router is applied to L's hidden state and the experts it picks
	// are promoted to PrefetchTo in the background.
	Prefetch bool
	// PrefetchTo is the level prefetches promote to: VRAM (the zero
	// value) or RAM. RAM overlaps only the slow levels (disk, swarm) with
	// compute and leaves the GPU's one queue to the demand (a VRAM
	// prefetch's upload is queued ahead of the layer's own dispatches,
	// which wait for it). Where uploads set the speed (a quarter of
	// Mixtral's experts in VRAM on the H100) no prefetch at all was 7%
	// faster in the medians, about the runs' spread, and VRAM's hit rate
	// 0.85 against 0.76 (experts/BENCHMARKS.md).
	PrefetchTo tiers.Level
	// PrefetchSure, with PrefetchTo RAM, promotes a guessed expert to
	// VRAM instead where guesses like it are sure: in this run, the
	// guesses whose lead (how far the guessed expert's routing score led
	// the best expert not guessed) fell in the same bucket of GuessLeads
	// were right PrefetchSure of the time or more, over at least
	// SureAfter of them (see sure). A rate, not a lead: measured on the
	// run's own guesses, whatever the router and the weights. 0: never.
	PrefetchSure float64
	// sureAfter overrides SureAfter (tests).
	sureAfter int
	// Predicted and Correct count next-layer predictions and those the
	// router then really chose; Leads splits them by how far the guess
	// led the experts not guessed (GuessLeads' bounds).
	Predicted, Correct int
	Leads              [len(GuessLeads) + 1]GuessCount
	predicted          map[int]guess // the next layer's guesses, by expert
	// keys are the expert matrices' cache keys by tensor name, and
	// layerKeys each MoE layer's (three an expert, in order; nil where the
	// manifest lacks one): a resident step holds every matrix of every
	// layer, and a key's shard CID is a hex decode.
	keys      map[string]tiers.Key
	layerKeys [][]tiers.Key
	// Profile is where the steps' wall time went.
	Profile StepProfile
	// onChoice, if not nil, is told each MoE layer's choice as the host
	// learns it (tests: RefModel.Follow).
	onChoice func(l int, ids []int)
	// fuseO adds the o product into the residual in one dispatch (instead
	// of a product and an Accumulate); fuseSwiGLU has the down products
	// compute SwiGLU of the gate and up halves themselves (instead of a
	// SwiGLU dispatch). Both were off when, on the H100, fusing both was
	// 4-5% slower in an A/B (the fused down product recomputes SwiGLU in
	// every workgroup). RDRR_GPU_FUSE picks them for measurements: o,
	// swiglu, 1 (both) or 0 (neither); see fusions.
	fuseO, fuseSwiGLU bool
	// partNorm hands each RMSNorm from the accumulate that writes its
	// input (ops.AccumulateNorm: x * g and partial sums of x^2, in normed)
	// to the products that read it (q k v, a masked layer's router and
	// gate and up products, the LM head): no dispatch of its own. For
	// models where every write of x is such an accumulate (every layer
	// MoE, no shared experts, the o product not adding into x itself); a
	// paged layer's FFN, and products of other layouts, still read xn from
	// an RMSNorm dispatch. Off unless RDRR_GPU_NORM=1: on the H100 it
	// took 64 dispatches a step away and 0.3 ms of the GPU's profiled
	// busy time, yet the resident step was 1.4% slower (145.4 against
	// 147.5 tok/s, experts/BENCHMARKS.md), as the o product adding into x
	// was (fuseO).
	partNorm bool
	normed   ops.Normed
	// fuseRouter computes a masked MoE layer's router product inside its
	// routing dispatch (ops.RouterRoute: one workgroup, for at most
	// ops.MaxRouterExperts experts) instead of a product and a Route
	// (not with partNorm, whose router reads the norm handed over). On
	// unless RDRR_GPU_ROUTER=0 (for measurements). The resident step on
	// an H200 ran 1.9% faster with it (3 of 3 pairs). A paged layer's
	// choice takes the same form, so that its logits have the bits of a
	// masked layer's (TestGPUModelPagedSameBits; fused there it was 1-3%
	// slower in 2 of 2 pairs, within the paged step's noise,
	// experts/BENCHMARKS.md, 2026-11-28); the next layer's guess keeps
	// the two dispatches. With partNorm (opt-in) a masked layer's router
	// and gate and up products read the norm handed over and a paged
	// layer's do not: the two forms' bits differ there.
	fuseRouter bool
	// glu runs an expert's gate and up products in one workgroup, which
	// writes silu(gate) * up for the down products: the SwiGLU dispatch
	// between them gone (ops.Masked.UpSlots for a layer's resident
	// experts, ops.Group.UpSlots for paged ones). On unless RDRR_GPU_GLU=0
	// (for measurements) or RDRR_GPU_FUSE has the down products compute
	// SwiGLU; used for a masked layer where each expert's gate and up
	// matrices lie in one arena buffer, and for paged experts where all of
	// the call's matrices do (else the separate products run).
	glu bool
	// fusedFFN runs a resident MoE layer's gate, up and down products as
	// one dispatch (ops.Q4KFFN) where its experts' matrices lie in one
	// arena buffer and the shapes allow: the same bits as the two masked
	// dispatches (gate and up, then down), without the barrier between
	// them, so that the down products' first loads overlap the gate and
	// up products' tail. On an H200 (gpu/BENCHMARKS.md, 2026-11-29) the
	// Mixtral-shaped pair took 71.7 us against 75.1-75.7. A CPU adapter
	// runs the kernel's two phases apart (lavapipe cannot wait). On
	// unless RDRR_GPU_FFN=0; ffnCounters are its tile counters, ffnFits
	// whether the model's shape is one the kernel takes, ffnApart whether
	// it runs apart (a CPU adapter), both fixed at load.
	fusedFFN          bool
	ffnCounters       *gpu.Buffer
	ffnFits, ffnApart bool
	ffnRecorded       int // Q4KFFN dispatches recorded: checkFFN reads the counters only after one, and the tests count them
	// xq has the layers' Q4_K products read their x quantized
	// (ops.QuantizeX: 8-bit integers and a scale a group of 16 values)
	// and run as integer multiply-adds of two weights at a time
	// (ops.Q4KMatVecXQ, ops.Group.XQ, ops.Masked.XQ): the norms before the
	// q k v product and the experts hand their output over quantized too
	// (ops.RMSNormXQ), as does the attention's merge (ops.AttentionXQ),
	// and the gate and up products' output is quantized by a dispatch of
	// its own. The LM head reads x quantized only with xqAttn (xqHead).
	// On unless RDRR_GPU_XQ=0, with glu
	// and not with partNorm. On an H200 the masked gate and up products
	// took 52 us against 71, the down products 27 against 38
	// (gpu/BENCHMARKS.md, 2026-11-28, evening).
	xq bool
	// xqAttn is xq for the attention's products (q k v and o) too: on
	// with xq unless RDRR_GPU_XQ=experts or SetActivations("q8-experts"),
	// as llama.cpp's CUDA path quantizes every quantized product's x (to 8
	// bits in groups of 32; these groups are 16). Inside the resident
	// step on an H200 it takes 3.6% off (4.49 -> 4.33 ms, alternated every
	// 10 steps, twice; experts/BENCHMARKS.md, 2026-11-29). Its rounding
	// turns router choices on tiny-moe, an untrained model whose routers'
	// margins are small (8 and 15 changed counts of a layer's expert in 32
	// steps, for q k v and o, against none with the experts' alone): its
	// logits then differ from the float model's by up to 0.29 of the
	// largest against 0.016, and match the reference that quantizes as
	// it does within 1.5e-2 on lavapipe and 9.4e-3 on an H200 (1.1e-2 on
	// lavapipe before the LM head's x was quantized too, xqHead).
	xqAttn bool
	// xqHead has the LM head read the final norm quantized too, with
	// xqAttn (quantizedHead); RDRR_GPU_XQHEAD=0 turns it off, for
	// measurements.
	xqHead bool
	// perSubmit is how many masked layers a step records before it
	// submits them, unless it is recorded ahead (see begin):
	// maskedPerSubmit, or RDRR_GPU_PER_SUBMIT for every step (perSubmitSet;
	// for measurements). On an H200 (experts/BENCHMARKS.md, 2026-11-28,
	// evening) a step recorded ahead ran 200.2 and 205.0 tok/s in one
	// submission against 195.5 and 196.4 in submissions of 4 layers.
	perSubmit    int
	perSubmitSet bool
	// yq has the gate and up products quantize their output themselves
	// (where gluYQ allows); off (RDRR_GPU_YQ=0, for measurements), a
	// dispatch of its own quantizes it.
	yq bool
	// accNorm defers the accumulates into x (after the o product, after
	// the experts) to the norm of x that follows (pending): one dispatch,
	// ops.AccumulateRMSNormXQ, whatever that norm's output (the attention's
	// norm of float x too, its quantized copy unread); whatever else
	// reads x first records the accumulate (flushAcc): 64 dispatches a
	// Mixtral-shaped step fewer. With xq, unless RDRR_GPU_ACCNORM=0 (for
	// measurements). On an H200 (experts/BENCHMARKS.md, 2026-11-28,
	// night) the resident step ran 209.1 and 208.6 tok/s with it against
	// 200.0 and 199.3 without (4.6%, 2 of 2 pairs).
	accNorm bool
	pending pendingAcc
	// ropeAttn rotates q and k and stores the new KV row inside the
	// attention's split dispatch (ops.RopeAttention, where its shape
	// allows) instead of a rope_kv dispatch before it: 32 dependent
	// dispatches a Mixtral-shaped step fewer. RDRR_GPU_ROPE=0 turns it
	// off, for measurements.
	ropeAttn bool
	// l2Router has a read of a MoE layer's router weights into the GPU's
	// L2 cache (ops.L2Prefetch) run beside the dispatch before the router
	// (the one-workgroup FFN norm; with routeNorm, in a resident layer,
	// the o product, where it took 0.3% off), so that the router's
	// product finds them there: for routers of at most maxL2Router
	// bytes. On an H200 (experts/BENCHMARKS.md) the resident
	// step took 4496 us against 4543 without (-1.0%; the two alternated
	// every 10 steps of one generation), where prefetching a layer's q k
	// v and o weights (14 and 9 MB) the same way beside its attention's
	// norm and merge made it 3% slower (those latency-bound dispatches
	// wait on loads that queue behind the prefetch's). Since the router
	// took its shape as constants (80 registers where it had 173), the
	// prefetch no longer pays: on/off 1.000 and 0.999 in an A/B inside the
	// step (H200, 2026-11-30), so it is off unless RDRR_GPU_L2=1, and the
	// step has 32 dispatches fewer.
	l2Router bool
	// routerL2 is, by layer, the router weights l2Router reads and the
	// read's own sink (zero where it reads none: not a MoE layer, or a
	// router over maxL2Router).
	routerL2 []l2Read
	// routeNorm has a MoE layer's router normalize x + o itself
	// (ops.RouterRouteNorm: each logit the router's row by (x + o) * g over
	// the rms of x + o) and run beside
	// its FFN norm, which then writes buffers of that layer's own (ffnBufs:
	// ops.AccumulateRMSNormXQTo, x + o into x2, the next layer's norm
	// reading it back into x), so that no barrier holds either behind the
	// other (see routesBeside). On unless RDRR_GPU_ROUTENORM=0.
	routeNorm bool
	// ffnBufs are, by layer, the buffers a MoE layer's FFN norm writes
	// with routeNorm (nil where the model cannot run it).
	ffnBufs []*ffnBuf
	// ab is the A/B inside the step that SetAB (or RDRR_GPU_AB) started,
	// if any (ab.go).
	ab *abTest
	// clock measures the generated steps of the last generation
	// (StepMedian).
	clock stepClock
	// pipeline has Generate record each step while the GPU runs the one
	// before it (generatePipelined); RDRR_GPU_PIPELINE=0 turns it off,
	// for measurements.
	pipeline bool
	// settling is the step before the one begin is recording, not yet
	// ended, when generatePipelined records ahead (see settle).
	settling *settling
	// ProfileGPU and GPUTimes: see StepProfile's note.
	ProfileGPU bool
	GPUTimes   map[string]time.Duration
}

// StepProfile splits the wall time of the decode steps: recording and
// submitting work, waiting for the router's choice to come back, waiting
// for experts to be paged into VRAM (the stall), and waiting for the
// logits. What is left of Total is the GPU running while the host waits in
// one of the waits, or host work not counted here.
type StepProfile struct {
	Steps     int           `json:"steps"`
	Submits   int           `json:"submits"`
	Readbacks int           `json:"readbacks"`
	Total     time.Duration `json:"totalNs"`
	Record    time.Duration `json:"recordNs"` // recording and submitting dispatches
	// Ahead is the part of Record spent encoding the next paged layer's
	// attention and router while the GPU runs this one's (off the
	// critical path: the host would otherwise wait for the router), and
	// later layers' fixed parts (encodeFixed) while it copies misses.
	Ahead      time.Duration `json:"aheadNs"`
	RouteWait  time.Duration `json:"routeWaitNs"`  // reading back the router's choice
	PageWait   time.Duration `json:"pageWaitNs"`   // leases: experts paged into VRAM
	LogitsWait time.Duration `json:"logitsWaitNs"` // reading back the logits
	TurnProfile
	// MaskedLayers counts MoE layers run with all their experts resident
	// and the router's choice left on the GPU (no read-back).
	MaskedLayers int `json:"maskedLayers"`
}

// TurnProfile is the part of a StepProfile about the host's turns after
// paged layers' choices.
type TurnProfile struct {
	// Turn is the host's turn after a paged layer's choice came back:
	// from the end of its read-back to the submit of what follows it
	// (the misses' products, the next layer). The GPU meanwhile runs only
	// the layer's resident experts; whatever of Turn they do not cover,
	// it idles. Turns counts them; TurnsHit and TurnHit are the turns of
	// layers whose chosen experts were all resident (no page-in).
	Turns    int           `json:"turns"`
	Turn     time.Duration `json:"turnNs"`
	TurnsHit int           `json:"turnsHit"`
	TurnHit  time.Duration `json:"turnHitNs"`
	// FirstCopy sums, over the turns that paged a matrix in, the time
	// from the turn's start to the return of the first get that loaded
	// one (its copy submitted): how long the GPU waits for its first
	// copy, less whatever the layer's resident experts ran meanwhile.
	FirstCopy time.Duration `json:"firstCopyNs"`
	// Early counts the layers that came with their fixed part (attention,
	// router) encoded early, while the GPU copied an earlier layer's
	// misses.
	Early int `json:"early"`
}

// minus returns p less q.
func (p TurnProfile) minus(q TurnProfile) TurnProfile {
	return TurnProfile{p.Turns - q.Turns, p.Turn - q.Turn, p.TurnsHit - q.TurnsHit, p.TurnHit - q.TurnHit, p.FirstCopy - q.FirstCopy, p.Early - q.Early}
}

// ProfileGPU, set on a GPUModel, makes each step submit and wait after
// every part of a resident layer (embedding, attention, router, experts,
// head) and add the time to GPUTimes: where the GPU's time goes, at the
// cost of the overlap (a diagnostic, much slower than a normal step).

// NewGPUModel uploads m's dense tensors (read through cache) and sizes the
// buffers of one decode step. cache must have a VRAM level (arena) whose
// slots hold one expert each.
func NewGPUModel(ctx context.Context, m *Manifest, d *gpu.Device, cache *tiers.Cache, arena *tiers.GPUArena, maxPos int) (*GPUModel, error) {
	c := &m.Config
	switch {
	case c.Experts() == 0:
		return nil, fmt.Errorf("experts: %s has no experts", m.ModelID)
	case len(m.Experts) == 0 || ExpertMatrixBytes(m) != arena.SlotSize():
		return nil, fmt.Errorf("experts: arena slots of %d bytes; the GPU engine pages one expert matrix (%d bytes) per slot", arena.SlotSize(), ExpertMatrixBytes(m))
	}
	for _, e := range m.Experts {
		if len(e.Tensors) != 3 {
			return nil, fmt.Errorf("experts: layer %d expert %d is not three matrices", e.Layer, e.Index)
		}
		for _, name := range e.Tensors {
			if t := m.Tensors[name]; t.DType != Q4K || t.Size != arena.SlotSize() {
				return nil, fmt.Errorf("experts: %s is not a Q4_K matrix of %d bytes", name, arena.SlotSize())
			}
		}
	}
	g := &GPUModel{m: m, d: d, k: ops.NewKernels(d), cache: cache, arena: arena, dense: map[string]*gpu.Buffer{}, buf: map[string]*gpu.Buffer{}, MaxPos: maxPos}
	g.fuseO, g.fuseSwiGLU = fusions(os.Getenv("RDRR_GPU_FUSE"))
	g.pipeline = os.Getenv("RDRR_GPU_PIPELINE") != "0"
	g.glu = os.Getenv("RDRR_GPU_GLU") != "0" && !g.fuseSwiGLU
	g.fusedFFN = os.Getenv("RDRR_GPU_FFN") != "0"
	g.ffnFits = m.Config.Experts() <= ops.MaxFFNExperts && ops.CanFFN(m.Config.HiddenSize, m.Config.ExpertFFN(), m.Config.NumExpertsPerTok)
	g.ffnApart = d.Info().Type == "cpu"
	g.fuseRouter = os.Getenv("RDRR_GPU_ROUTER") != "0"
	g.partNorm = os.Getenv("RDRR_GPU_NORM") == "1" && !g.fuseO && m.Config.NumSharedExperts == 0 && ops.AccumParts(m.Config.HiddenSize) <= ops.MaxParts
	for l := range m.Config.NumHiddenLayers {
		g.partNorm = g.partNorm && m.Config.IsMoE(l)
	}
	g.xq = os.Getenv("RDRR_GPU_XQ") != "0" && g.canXQ()
	g.xqAttn = g.xq && os.Getenv("RDRR_GPU_XQ") != "experts"
	g.xqHead = os.Getenv("RDRR_GPU_XQHEAD") != "0"
	g.yq = os.Getenv("RDRR_GPU_YQ") != "0"
	g.accNorm = os.Getenv("RDRR_GPU_ACCNORM") != "0"
	g.l2Router = os.Getenv("RDRR_GPU_L2") == "1"
	g.ropeAttn = os.Getenv("RDRR_GPU_ROPE") != "0"
	g.routeNorm = os.Getenv("RDRR_GPU_ROUTENORM") != "0"
	g.perSubmit = maskedPerSubmit
	if n, err := strconv.Atoi(os.Getenv("RDRR_GPU_PER_SUBMIT")); err == nil && n > 0 {
		g.perSubmit, g.perSubmitSet = n, true
	}
	g.groupExperts()
	g.expertKeys()
	for _, ex := range m.Experts {
		for _, name := range ex.Tensors {
			cache.SetGroup(g.keys[name], ex.Layer) // the forecast policy's walk
		}
	}
	rm := &RefModel{m: m, cache: cache}
	inExpert := map[string]bool{}
	for _, e := range m.Experts {
		for _, t := range e.Tensors {
			inExpert[t] = true
		}
	}
	// Each layer's Wq, Wk and Wv stacked into one matrix (Q4_K rows of the
	// same width concatenate): one product instead of three, and its k and
	// v rows go into the KV cache by a kernel that binds the cache whole.
	fused := map[string]bool{}
	for l := 0; l < c.NumHiddenLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.self_attn.", l)
		names := []string{p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"}
		var raw []byte
		for _, name := range names {
			t, ok := m.Tensors[name]
			if !ok || t.DType != Q4K || len(t.Shape) != 2 || t.Shape[1] != int64(c.HiddenSize) {
				raw = nil
				break
			}
			b, err := rm.rawTensor(ctx, name)
			if err != nil {
				g.Close()
				return nil, err
			}
			raw = append(raw, b...)
		}
		if raw == nil {
			g.qkv = append(g.qkv, nil)
			continue
		}
		b, err := g.upload(ctx, raw)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.qkv = append(g.qkv, b)
		for _, name := range names {
			fused[name] = true
		}
	}
	for name, t := range m.Tensors {
		if inExpert[name] || fused[name] {
			continue
		}
		if t.DType != Q4K && t.DType != F32 {
			g.Close()
			return nil, fmt.Errorf("experts: tensor %s is %s; the GPU engine takes Q4_K and F32", name, t.DType)
		}
		raw, err := rm.rawTensor(ctx, name)
		if err != nil {
			g.Close()
			return nil, err
		}
		b, err := g.upload(ctx, raw)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.dense[name] = b
	}
	h, hd, ffn := c.HiddenSize, c.HeadDimension(), c.ExpertFFN()
	nq, nkv, k := c.NumAttentionHeads, c.NumKeyValueHeads, c.NumExpertsPerTok
	wide := max(c.IntermediateSize, ffn*max(c.NumSharedExperts, 1)) // dense and shared FFNs
	sizes := map[string]int{
		"dgate": wide * 4, "dup": wide * 4, "dact": wide * 4, "dy": h * 4,
		"tok": 4, "x": h * 4, "xn": h * 4, "q": nq * hd * 4, "qkv": (nq + 2*nkv) * hd * 4, "att": nq * hd * 4, "o": h * 4,
		"rlogits": c.Experts() * 4, "ids": idsGuessOff + c.Experts()*4, "w": k * 4, "gu": 2 * ((k*ffn*4 + 255) / 256 * 256),
		"act": k * ffn * 4, "y": k * h * 4, "out": (c.VocabSize*4+255)/256*256 + 256 + c.NumHiddenLayers*256, "ones": 16, "sampled": 16, "freqs": hd / 2 * 4,
		"pxn": h * 4, "plogits": c.Experts() * 4, "pw": k * 4, "xg": h * 4, "parts": ops.AccumParts(h) * 4,
		"xnq": int(ops.XQBytes(h)) + 16, "actq": k*int(ops.XQBytes(ffn)) + 16, "attq": int(ops.XQBytes(nq*hd)) + 16,
	}
	for name, n := range sizes {
		b, err := d.Alloc(uint64(n))
		if err != nil {
			g.Close()
			return nil, err
		}
		g.buf[name] = b
	}
	g.normed = ops.Normed{XG: g.buf["xg"], Parts: g.buf["parts"], Eps: float32(c.RMSNormEps)}
	ctr, err := d.Alloc(ops.FFNCounterBytes)
	if err != nil {
		g.Close()
		return nil, err
	}
	g.ffnCounters = ctr
	if err := d.Write(g.ffnCounters, make([]byte, ops.FFNCounterBytes)); err != nil { // Alloc's pooled buffers are not zeroed
		g.Close()
		return nil, err
	}
	g.routerL2 = make([]l2Read, c.NumHiddenLayers)
	for l := range g.routerL2 {
		rw := g.dense[fmt.Sprintf("model.layers.%d.mlp.gate.weight", l)]
		if !c.IsMoE(l) || rw == nil || gpu.SpanOf(rw).Size() > maxL2Router {
			continue
		}
		sink, err := d.Alloc(16)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.routerL2[l] = l2Read{rw, sink}
	}
	if canRouteNorm(c) {
		g.ffnBufs = make([]*ffnBuf, c.NumHiddenLayers)
		for l := range g.ffnBufs {
			if !c.IsMoE(l) {
				continue
			}
			p := fmt.Sprintf("model.layers.%d.", l)
			f := &ffnBuf{router: g.dense[p+"mlp.gate.weight"], norm: g.dense[p+"post_attention_layernorm.weight"]}
			g.ffnBufs[l] = f
			var err1, err2, err3 error
			f.x2, err1 = d.Alloc(uint64(h * 4))
			f.xn, err2 = d.Alloc(uint64(h * 4))
			f.xnq, err3 = d.Alloc(ops.XQBytes(h))
			if err := errors.Join(err1, err2, err3); err != nil {
				g.Close() // releases those allocated
				return nil, err
			}
		}
	}
	kv := uint64(maxPos * nkv * hd * 4)
	for l := 0; l < c.NumHiddenLayers; l++ {
		kb, err1 := d.Alloc(kv)
		vb, err2 := d.Alloc(kv)
		if err1 != nil || err2 != nil {
			for _, b := range []*gpu.Buffer{kb, vb} {
				if b != nil {
					b.Release() // the one that was allocated
				}
			}
			g.Close()
			return nil, fmt.Errorf("experts: KV cache: %v %v", err1, err2)
		}
		g.kc, g.vc = append(g.kc, kb), append(g.vc, vb)
	}
	if err := d.Write(g.buf["ones"], gpu.Bytes([]float32{1, 1, 1, 1})); err != nil {
		g.Close()
		return nil, err
	}
	if err := d.Write(g.buf["freqs"], gpu.Bytes(ops.RopeFreqs(c.RopeTheta, hd))); err != nil {
		g.Close()
		return nil, err
	}
	if err := g.compile(ctx); err != nil {
		g.Close()
		return nil, err
	}
	if err := g.SetAB(os.Getenv("RDRR_GPU_AB")); err != nil {
		g.Close()
		return nil, err
	}
	return g, nil
}

// idsPredOff is where, in the ids buffer, the next layer's predicted
// experts go after this layer's chosen ones, and idsGuessOff where the
// guess's router logits go (copied there): one read-back brings them
// all. 256 is WebGPU's largest minStorageBufferOffsetAlignment.
const (
	idsPredOff  = 256
	idsGuessOff = 512 // idsPredOff and room for k <= 64 ids
)

// GuessLeads are the upper bounds of the buckets that GPUModel.Leads
// counts the next layer's guesses in, by how far a guessed expert's
// routing score led the experts not guessed (guessLead: logits for a
// softmax router, four times the sigmoid scores' difference for a
// sigmoid one); the last bucket is above them. A lead not known (or NaN)
// counts in the first.
var GuessLeads = [...]float64{0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 4}

// SureAfter is how many guesses a bucket of GuessLeads counts before
// PrefetchSure trusts its rate.
const SureAfter = 32

// sure reports whether a guess that led by lead is sure: its bucket's
// guesses, SureAfter or more, were right PrefetchSure of the time or
// more; or, while its bucket has counted fewer, the nearest bucket below
// it that has counted enough is sure (a guess that leads by more is
// right at least as often, and the buckets of large leads fill last).
// A lead not known (NaN) is never sure.
func (g *GPUModel) sure(lead float64) bool {
	if g.PrefetchSure <= 0 || math.IsNaN(lead) {
		return false
	}
	n := SureAfter
	if g.sureAfter > 0 {
		n = g.sureAfter
	}
	for b := leadBucket(lead); b >= 0; b-- {
		if c := g.Leads[b]; c.Guesses >= n {
			return float64(c.Right) >= g.PrefetchSure*float64(c.Guesses)
		}
	}
	return false
}

// A guess is a guessed expert of the next layer: its matrices'
// prefetches, its lead (guessLead; NaN if not known) and whether it went
// to VRAM as sure.
type guess struct {
	prefetches []*tiers.Prefetch
	lead       float64
	sure       bool
}

// A GuessCount is the guesses of one bucket, how many were right, and
// how many of them went to VRAM as sure (PrefetchSure), counted when the
// router's choice scores them.
type GuessCount struct {
	Guesses int `json:"guesses"`
	Right   int `json:"right"`
	Sure    int `json:"sure"`
}

// guessLead returns each guessed expert's lead (ids, u32) over the best
// expert not guessed, in the routing scores of logits (f32, one per
// expert).
func (g *GPUModel) guessLead(ids, logits []byte) map[int]float64 {
	c := &g.m.Config
	n := c.Experts()
	if len(logits) < 4*n {
		return nil
	}
	raw := make([]float64, n)
	for e := range raw {
		raw[e] = float64(math.Float32frombits(binary.LittleEndian.Uint32(logits[4*e:])))
	}
	score := ref.RouteScores(raw, c.refRoute())
	guessed := map[int]bool{}
	for i := 0; i+4 <= len(ids); i += 4 {
		if e := int(binary.LittleEndian.Uint32(ids[i:])); e < n {
			guessed[e] = true
		}
	}
	best := math.Inf(-1) // of the experts not guessed
	for e, v := range score {
		if !guessed[e] && v > best {
			best = v
		}
	}
	// A sigmoid router's scores are in (0, 1) (plus its bias): their
	// difference times four is the logit difference it is at the
	// sigmoid's steepest (slope 1/4), so that its leads spread over the
	// buckets as a softmax router's logits do.
	scale := 1.0
	if c.ScoringFunc == "sigmoid" {
		scale = 4
	}
	out := make(map[int]float64, len(guessed))
	for e := range guessed {
		out[e] = (score[e] - best) * scale
	}
	return out
}

// route is the router's shape: Mixtral softmax over the top-k, or
// DeepSeek-V3 sigmoid with group-limited selection.
func (g *GPUModel) route() ops.RouteShape {
	c := &g.m.Config
	r := ops.RouteShape{Tokens: 1, Experts: c.Experts(), K: c.NumExpertsPerTok, Mode: abi.RouteSoftmaxTopK}
	if c.ScoringFunc == "sigmoid" {
		r.Mode, r.Groups, r.TopKGroup = abi.RouteSigmoidTopK, c.NGroup, c.TopKGroup
	}
	return r
}

// ffn records x += down(silu(gate xn) * up xn) for resident weights under
// prefix (a dense layer's FFN, or the shared experts).
func (g *GPUModel) ffn(ctx context.Context, b *gpu.Batch, prefix string, n int) {
	B, h := g.buf, g.m.Config.HiddenSize
	gate, up, act := B["dgate"].Sub(0, uint64(n*4)), B["dup"].Sub(0, uint64(n*4)), B["dact"].Sub(0, uint64(n*4))
	g.k.Q4KMatVec(ctx, b, g.dense[prefix+"gate_proj.weight"], B["xn"], gate, n, h)
	g.k.Q4KMatVec(ctx, b, g.dense[prefix+"up_proj.weight"], B["xn"], up, n, h)
	g.k.SwiGLU(ctx, b, gate, up, act, n)
	g.k.Q4KMatVec(ctx, b, g.dense[prefix+"down_proj.weight"], act, B["dy"], h, n)
	g.flushAcc(ctx, b)
	g.k.Accumulate(ctx, b, B["dy"], B["ones"], B["x"], ops.AccumShape{Experts: 1, Dim: h})
}

// group records y = the products of the matrices in arena slots with x
// (one x for all if shared, else one per product), rows of each product
// one after another. Slots in one arena buffer run as one
// Q4KMatVecGroup; slots spread over several buffers run one by one.
//
// With xq, x is quantized (ops.QuantizeX's form, ops.XQBytes(cols) a
// vector).
func (g *GPUModel) group(ctx context.Context, b *gpu.Batch, slots []int, x gpu.Region, shared, xq bool, y *gpu.Buffer, yOff uint64, rows, cols int) {
	k := g.m.Config.NumExpertsPerTok // every expert product in the layout of k (ops.Group.K)
	buf0, _ := g.arena.Locate(slots[0])
	idx := make([]int, len(slots))
	same := true
	for i, s := range slots {
		var buf *gpu.Buffer
		buf, idx[i] = g.arena.Locate(s)
		same = same && buf == buf0
	}
	if same {
		g.k.Q4KMatVecGroup(ctx, b, ops.Group{Arena: buf0, Slots: idx, X: x, SharedX: shared, Y: y.Sub(yOff, uint64(len(slots)*rows*4)), Rows: rows, Cols: cols, XQ: xq, K: k})
		return
	}
	xs := gpu.SpanOf(x)
	xBytes := uint64(cols * 4)
	if xq {
		xBytes = ops.XQBytes(cols)
	}
	for i, s := range slots {
		buf, j := g.arena.Locate(s)
		xi := gpu.Region(xs)
		if !shared {
			xi = xs.Buffer().Sub(xs.Offset()+uint64(i)*xBytes, xBytes)
		}
		g.k.Q4KMatVecGroup(ctx, b, ops.Group{Arena: buf, Slots: []int{j}, X: xi, SharedX: true, Y: y.Sub(yOff+uint64(i*rows*4), uint64(rows*4)), Rows: rows, Cols: cols, XQ: xq, K: k})
	}
}

// score counts which of the experts predicted for this layer the router
// chose, and cancels the prefetches of the others that have not run.
func (g *GPUModel) score(ids []byte) {
	if g.predicted == nil {
		return
	}
	chosen := map[int]bool{}
	for i := 0; i+4 <= len(ids); i += 4 {
		chosen[int(binary.LittleEndian.Uint32(ids[i:]))] = true
	}
	for e, gs := range g.predicted {
		g.Predicted++
		lb := &g.Leads[leadBucket(gs.lead)]
		lb.Guesses++
		if gs.sure {
			lb.Sure++
		}
		if chosen[e] {
			g.Correct++
			lb.Right++
			continue // the demand uses (or waits for) what was prefetched
		}
		for _, p := range gs.prefetches {
			p.Cancel() // a wrong guess: queued ones never run, loading ones keep nothing
		}
	}
	g.predicted = nil
}

// leadBucket is the index in GPUModel.Leads of a guess's lead (the
// first for NaN).
func leadBucket(lead float64) int {
	if math.IsNaN(lead) {
		return 0
	}
	for i, b := range GuessLeads {
		if lead < b {
			return i
		}
	}
	return len(GuessLeads)
}

// prefetch asks the cache to bring layer l's predicted experts (ids) to
// PrefetchTo, or to VRAM those that are sure (PrefetchSure).
func (g *GPUModel) prefetch(l int, ids, logits []byte) {
	g.predicted = map[int]guess{}
	leads := g.guessLead(ids, logits)
	for i := 0; i+4 <= len(ids); i += 4 {
		e := int(binary.LittleEndian.Uint32(ids[i:]))
		ex, ok := g.m.Expert(l, e)
		if !ok {
			continue
		}
		lead, ok := leads[e]
		if !ok {
			lead = math.NaN() // no logits came back with the guess
		}
		gs := guess{lead: lead}
		to := g.PrefetchTo
		if to == tiers.RAM && g.sure(lead) {
			to, gs.sure = tiers.VRAM, true
		}
		for _, name := range ex.Tensors {
			gs.prefetches = append(gs.prefetches, g.cache.Prefetch(g.matrixKey(name), to, 1))
		}
		g.predicted[e] = gs
	}
}

// matrixKey is the cache key of an expert matrix: its byte range, which
// lies inside one shard (NewGPUModel checked that it is one arena slot).
func (g *GPUModel) matrixKey(name string) tiers.Key {
	if k, ok := g.keys[name]; ok {
		return k
	}
	t := g.m.Tensors[name]
	s := &g.m.Shards[t.Shard]
	return tiers.Key{Blob: s.CID(), Size: s.Size, Off: t.Offset, Len: t.Size}
}

// Activations names what the layers' Q4_K products read: "q8" (x
// quantized, xq, for every product of the layers and the LM head, unless
// RDRR_GPU_XQHEAD=0), "q8-experts" (for the experts' products only) or
// "f32".
func (g *GPUModel) Activations() string {
	switch {
	case g.xq && g.xqAttn:
		return "q8"
	case g.xq:
		return "q8-experts"
	}
	return "f32"
}

// ActivationModes are SetActivations' choices, the default first.
var ActivationModes = []string{"q8", "q8-experts", "f32"}

// canXQ reports whether the model's forms allow products of quantized x:
// gate and up together, no norm handed over, whole groups of x.
func (g *GPUModel) canXQ() bool {
	c := &g.m.Config
	return g.glu && !g.partNorm && c.HiddenSize%ops.XQGroup == 0 && c.ExpertFFN()%ops.XQGroup == 0
}

// SetActivations has the layers' Q4_K products read x quantized ("q8":
// 8-bit integers and a scale a group of 16 values, where the model's
// forms allow it: GLU on, the norms not handed over; "q8-experts": the
// experts' products only, q k v and o of float x) or as float32 ("f32":
// the exact arithmetic), and compiles what that needs. The default is
// q8 (RDRR_GPU_XQ=0: f32, =experts: q8-experts). Call it before generating.
// An A/B (SetAB) starts again from the setting these activations give its
// toggle, or stops with an error where they leave it no meaning.
func (g *GPUModel) SetActivations(ctx context.Context, a string) error {
	var ab string // an A/B that runs: stopped, then started again from these activations
	if g.ab != nil {
		ab = g.ab.toggle
		g.SetAB("")
	}
	switch a {
	case "f32":
		g.xq, g.xqAttn = false, false
	case "q8", "q8-experts":
		g.xq = g.canXQ()
		g.xqAttn = g.xq && a == "q8"
		if !g.xq {
			return fmt.Errorf("experts: %s activations need the gate and up products together and no norm handed over (RDRR_GPU_GLU, RDRR_GPU_FUSE, RDRR_GPU_NORM)", a)
		}
	default:
		return fmt.Errorf("experts: activations %q (q8, q8-experts or f32)", a)
	}
	if err := g.SetAB(ab); err != nil {
		return err
	}
	return g.compile(ctx)
}

// expertKeys fills keys and layerKeys.
func (g *GPUModel) expertKeys() {
	c := &g.m.Config
	g.keys = map[string]tiers.Key{}
	for _, ex := range g.m.Experts {
		for _, name := range ex.Tensors {
			g.keys[name] = g.matrixKey(name)
		}
	}
	g.layerKeys = make([][]tiers.Key, c.NumHiddenLayers)
layer:
	for l := range g.layerKeys {
		keys := make([]tiers.Key, 0, 3*c.Experts())
		for e := 0; e < c.Experts(); e++ {
			ex, ok := g.m.Expert(l, e)
			if !ok || len(ex.Tensors) != 3 {
				continue layer
			}
			for _, name := range ex.Tensors {
				keys = append(keys, g.keys[name])
			}
		}
		g.layerKeys[l] = keys
	}
}

// ExpertKeys returns the cache keys of every expert matrix, in the
// manifest's order: what Cache.Warm takes to make a run start warm.
func (g *GPUModel) ExpertKeys() []tiers.Key {
	var keys []tiers.Key
	for _, e := range g.m.Experts {
		for _, name := range e.Tensors {
			keys = append(keys, g.matrixKey(name))
		}
	}
	return keys
}

// ExpertMatrices is the number of expert matrices of m: the arena slots
// that hold every expert (one matrix a slot).
func ExpertMatrices(m *Manifest) int {
	n := 0
	for _, e := range m.Experts {
		n += len(e.Tensors)
	}
	return n
}

// ExpertMatrixBytes is the size of one expert matrix of m (gate, up and
// down are the same size): the GPU engine's arena slot.
func ExpertMatrixBytes(m *Manifest) int64 {
	if len(m.Experts) == 0 {
		return 0
	}
	return m.Tensors[m.Experts[0].Tensors[0]].Size
}

// rawTensor returns tensor name's bytes, read (verified) through the cache.
func (rm *RefModel) rawTensor(ctx context.Context, name string) ([]byte, error) {
	t := rm.m.Tensors[name]
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
	return raw, nil
}

func (g *GPUModel) upload(ctx context.Context, raw []byte) (*gpu.Buffer, error) {
	b, err := g.d.Alloc(uint64((len(raw) + 3) / 4 * 4))
	if err != nil {
		return nil, err
	}
	if err := g.d.Upload(ctx, b, raw); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

// Busy keeps the model's GPU busy for about d (ops.Kernels.Busy), so that
// a timed run after a warm-up that left it idle starts at the clocks it
// will hold; it returns the copies that ran.
func (g *GPUModel) Busy(ctx context.Context, d time.Duration) (int, error) { return g.k.Busy(ctx, d) }

// Close releases the model's GPU buffers.
func (g *GPUModel) Close() {
	for _, b := range g.dense {
		b.Release()
	}
	for _, b := range g.buf {
		b.Release()
	}
	for i := range g.kc {
		g.kc[i].Release()
		g.vc[i].Release()
	}
	for _, b := range g.qkv {
		if b != nil {
			b.Release()
		}
	}
	for _, r := range g.routerL2 {
		if r.sink != nil {
			r.sink.Release()
		}
	}
	if g.ffnCounters != nil {
		g.ffnCounters.Release()
	}
	for _, f := range g.ffnBufs {
		if f != nil {
			for _, b := range []*gpu.Buffer{f.x2, f.xn, f.xnq} {
				if b != nil {
					b.Release()
				}
			}
		}
	}
	g.k.Close()
}

// Step runs one token at the next position and returns the logits.
//
// A MoE layer runs one of two ways. If every matrix of every one of its
// experts is in VRAM (held, so that nothing evicts them while the step
// runs), the router's choice stays on the GPU: masked products
// (Q4KMatVecMasked) run the experts it chose, and the layer costs no
// submit and no read-back. Otherwise the step submits what it has
// recorded, reads the choice back (with the next layer's guess), pages
// the chosen experts into VRAM and goes on. A fully resident model runs a
// token as one submission and one read-back (the logits and every masked
// layer's choice, for the stats and the trace).
func (g *GPUModel) Step(ctx context.Context, token int) ([]float32, error) {
	logits, _, err := g.step(ctx, token, head{logits: true})
	return logits, err
}

// head says what a step ends with: the logits read back (Step), a token
// sampled on the GPU and read back alone (4 bytes, not the vocabulary's
// logits: Generate), or neither (a prompt token before the last: no LM
// head at all).
type head struct {
	logits bool
	sample bool
	// The draw of a sampled token: greedy (argmax) at temperature 0, else
	// top-p with the uniform u (Sampling's rule).
	temperature, topP, u float64
}

// step runs one token; see Step and head.
func (g *GPUModel) step(ctx context.Context, token int, hd head) ([]float32, int, error) {
	p, err := g.begin(ctx, token, false, hd)
	if err != nil {
		return nil, 0, err
	}
	return g.end(ctx, p, true)
}

// A stepRun is a step submitted to the GPU whose end (its read-back of
// the logits, the sampled token and the masked layers' choices) the host
// has not collected yet: begin returns it, end collects it.
type stepRun struct {
	hd       head
	rd       *gpu.PendingRead // nil: nothing to read (the step was waited for)
	from, to uint64           // the span of out that rd reads
	masked   []int            // layers that ran masked: their choice comes back in rd
	start    time.Time
	// turns is what the step added to the profile's turns (taken back if
	// the step is discarded).
	turns  TurnProfile
	ended  bool
	logits []float32
	tok    int
	err    error
}

// begin records and submits one step at the next position and starts
// its read-back without waiting for it. The step embeds token, or, with
// onGPU, the token the step before it sampled, which never leaves the
// GPU: the host records this step while the GPU still runs that one
// (generatePipelined). A step that must page experts (a layer not wholly
// in VRAM) settles the step before it first (see settle).
func (g *GPUModel) begin(ctx context.Context, token int, onGPU bool, hd head) (_ *stepRun, err error) {
	c := &g.m.Config
	k := c.NumExpertsPerTok
	if !onGPU && (token < 0 || token >= c.VocabSize) {
		return nil, fmt.Errorf("experts: token %d outside the vocabulary of %d", token, c.VocabSize)
	}
	if g.pos >= g.MaxPos {
		return nil, fmt.Errorf("experts: position %d: the KV cache holds %d", g.pos, g.MaxPos)
	}
	// The clock reads before the A/B sets the toggle for this step: the
	// interval is the last step's, under its setting.
	if interval, counted := g.clock.mark(onGPU); g.ab != nil {
		g.abStep(interval, counted)
	}
	switch {
	case !onGPU:
		g.cache.BeginStep(token)
	case g.settling == nil:
		g.cache.BeginStep(-1) // its token stays on the GPU
	} // else settle tells the cache, with the token it collects
	B := g.buf
	pr := &g.Profile
	run := &stepRun{hd: hd, start: time.Now()}
	// A step recorded while the GPU runs the one before it submits its
	// masked layers together: the GPU has the last step to run meanwhile,
	// and each submission costs the host (params written, a command
	// buffer); else every perSubmit layers, so that the GPU starts early.
	perSubmit := g.perSubmit
	if onGPU && !g.perSubmitSet {
		perSubmit = c.NumHiddenLayers
	}
	before := pr.TurnProfile
	mark := run.start
	lap := func(d *time.Duration) { now := time.Now(); *d += now.Sub(mark); mark = now }
	var settled time.Duration // ending the step before this one (settle): collect counts it
	defer func() { pr.Total += time.Since(run.start) - settled }()
	tok := gpu.Region(B["sampled"].Sub(0, 4))
	if !onGPU {
		tok = B["tok"]
		if err := g.d.Write(B["tok"], binary.LittleEndian.AppendUint32(nil, uint32(token))); err != nil {
			return nil, err
		}
	}
	var held []*tiers.Lease // matrices of the masked layers, until their submit
	defer func() { releaseAll(held) }()
	var masked []int // layers that ran masked: their choice comes back at the end
	b := g.d.Batch()
	defer func() {
		if err != nil {
			b.Drop() // what is recorded and not submitted: its scratch buffers
		}
	}()
	// section, with ProfileGPU, submits what was recorded since the last
	// section and waits for it, charging the time to name.
	section := func(name string) error {
		if !g.ProfileGPU {
			return nil
		}
		t := time.Now()
		if err := b.Submit(ctx); err != nil {
			return err
		}
		if err := g.d.Sync(ctx); err != nil {
			return err
		}
		if g.GPUTimes == nil {
			g.GPUTimes = map[string]time.Duration{}
		}
		g.GPUTimes[name] += time.Since(t)
		b = g.d.Batch()
		return nil
	}
	g.pending = pendingAcc{} // a step that failed may have left one; the embedding writes x anew
	g.k.Embed(ctx, b, g.dense["model.embed_tokens.weight"], tok, B["x"], ops.EmbedShape{Type: abi.Q4K, Tokens: 1, Dim: c.HiddenSize, Vocab: c.VocabSize})
	g.embedNorm(ctx, b)
	if err := section("embed"); err != nil {
		return nil, err
	}
	// ahead is the next paged layer, encoded while the GPU runs this one
	// (encodeAhead): this layer's accumulate, the next one's attention,
	// router and the products of its resident experts, submitted as soon
	// as this layer's choice is known to need nothing else.
	var ahead *aheadLayer
	defer func() { ahead.drop() }()
	// pending is this layer if it came encoded ahead, until its resident
	// experts' products (rest) are submitted behind its read-back, and
	// the experts they read released.
	var pending *aheadLayer
	defer func() { pending.drop() }()
	// early holds later layers' fixed parts (encodeFixed), encoded while
	// the GPU runs the copies of a layer's misses: the host has time then,
	// and a layer whose chosen experts are all resident costs it less on
	// its way (its attention, encoded ahead, was most of its host time,
	// longer than what the GPU ran meanwhile). slack is how many matrices
	// the last layer paged in: their copies run before the next choice.
	early := map[int]*fixedLayer{}
	defer func() {
		for _, f := range early {
			f.enc.Drop()
		}
	}()
	slack := 0
	for l := 0; l < c.NumHiddenLayers; l++ {
		if f := early[l]; f != nil {
			// Not taken as the ahead of the layer before (it went masked,
			// or this one became resident): nothing will submit it.
			f.enc.Drop()
			delete(early, l)
		}
		copies := slack
		slack = 0
		p := fmt.Sprintf("model.layers.%d.", l)
		var predict bool
		var cur *aheadLayer // this layer, if it came encoded ahead
		if ahead != nil && ahead.l == l {
			// Submitted behind the last layer's experts: its attention,
			// router and resident experts' products are running.
			cur, ahead = ahead, nil
			pending = cur // its experts stay held until rest is submitted: its misses must not evict what they read
			predict = cur.predict
		} else {
			g.recordAttention(ctx, b, l)
			if err := section("attention"); err != nil {
				return nil, err
			}
			if !c.IsMoE(l) {
				// A dense layer (DeepSeek's first ones): its FFN, resident.
				g.normFFN(ctx, b, l)
				g.ffn(ctx, b, p+"mlp.", c.IntermediateSize)
				continue
			}
			layer := g.holdLayer(l)
			// A masked layer reads the FFN's norm from the accumulate
			// before it (partNorm); the others from a dispatch of its own.
			normed := layer != nil && g.partNorm
			// The choice goes straight into the out buffer, read back
			// with the logits.
			sel := B["out"].Sub(g.idsAt(l), uint64(k*4))
			beside := layer != nil && g.routesBeside(l)
			switch {
			case normed:
				g.k.MatVecNormed(ctx, b, g.dense[p+"mlp.gate.weight"], g.normed, B["rlogits"], c.Experts(), c.HiddenSize)
			case beside:
				// The router's weights read into the L2 beside the o
				// product, the router behind it, the norm beside the
				// router.
				g.prefetchRouter(ctx, b, l)
				g.routeFFN(ctx, b, l, B["rlogits"], sel, B["w"])
				g.ffnNorm(ctx, b, l)
			default:
				g.normFFN(ctx, b, l)
			}
			if layer != nil {
				switch {
				case normed:
					g.k.Route(ctx, b, B["rlogits"], nil, sel, B["w"], g.route())
				case !beside:
					g.router(ctx, b, l, B["xn"], B["rlogits"], sel, B["w"], g.route(), g.fuseRouter)
				}
				if err := section("router"); err != nil {
					return nil, err
				}
				held = append(held, layer...)
				g.recordMasked(ctx, b, l, layer, sel, normed)
				if err := section("experts"); err != nil {
					return nil, err
				}
				masked = append(masked, l)
				if len(masked)%perSubmit == 0 && l+1 < c.NumHiddenLayers {
					// Submit as we go: the GPU runs these layers while the
					// next ones are recorded (the last ones go with the
					// head and the read-back: one submission fewer).
					if err := b.Submit(ctx); err != nil {
						return nil, err
					}
					pr.Submits++
					held = releaseAll(held)
					b = g.d.Batch()
				}
				continue
			}
			// A layer to page: the step before this one must have ended
			// (the trace counts its experts first).
			t := time.Now()
			err := g.settle(ctx)
			settled += time.Since(t)
			mark = time.Now()
			if err != nil {
				return nil, err
			}
			predict = g.recordChoice(ctx, b, l)
			if err := b.Submit(ctx); err != nil {
				return nil, err
			}
			pr.Submits++
			held = releaseAll(held) // submitted: a later upload into their slots queues after
			lap(&pr.Record)
		}
		// The experts chosen (and the next layer's guess, in the same
		// read-back): page them into VRAM slots.
		n := k * 4
		if predict {
			n = idsGuessOff + c.Experts()*4
		}
		rd, err := g.d.StartRead(B["ids"].Sub(0, uint64(n)), n)
		if err != nil {
			return nil, err
		}
		pr.Readbacks++
		if pending != nil && pending.rest != nil {
			// The resident experts' products, behind the read-back.
			err := g.d.SubmitEncoded(ctx, pending.rest)
			pending.rest = nil
			if err != nil {
				rd.Wait(ctx, make([]byte, n))
				return nil, err
			}
			pr.Submits++
		}
		// Queued: a later upload into their slots runs after them.
		pending.release()
		pending = nil
		if next := l + 1; !g.ProfileGPU && next < c.NumHiddenLayers && c.IsMoE(next) && !g.resident(next) {
			// While the GPU runs this layer, encode the next one.
			f := early[next]
			delete(early, next)
			if ahead, err = g.encodeAhead(ctx, l, next, len(held), f); err != nil {
				rd.Wait(ctx, make([]byte, n))
				return nil, err
			}
			// The GPU copies the last layer's misses before this choice
			// (~0.7 ms a matrix on an H100): time to encode the fixed
			// parts of the layers after next (~0.3 ms each).
			for j := next + 1; j < c.NumHiddenLayers && j <= next+min(2*copies, maxEarly); j++ {
				if early[j] != nil || !c.IsMoE(j) || g.resident(j) {
					continue
				}
				if early[j], err = g.encodeFixed(ctx, j-1, j); err != nil {
					delete(early, j)
					rd.Wait(ctx, make([]byte, n))
					return nil, err
				}
			}
			pr.Ahead += time.Since(mark)
		}
		lap(&pr.Record)
		both := make([]byte, n)
		if err := rd.Wait(ctx, both); err != nil {
			return nil, err
		}
		lap(&pr.RouteWait)
		turn := mark
		idb := both[:k*4]
		// Page in what the chosen experts need that the GPU did not run
		// already: every matrix of an expert whose products did not all
		// run from a resident slot (cur's), its products recomputed at its
		// place in the choice.
		type want struct {
			e, k, j int
			name    string
		}
		var wants []want
		exs, err := g.chosen(l, idb)
		if err != nil {
			return nil, err
		}
		for pos, ex := range exs {
			if cur != nil && slices.Contains(cur.experts, ex.Index) {
				for _, name := range ex.Tensors {
					g.cache.Touch(g.matrixKey(name), tiers.VRAM) // a hit, as Get would count it
				}
				continue
			}
			for j, name := range ex.Tensors {
				wants = append(wants, want{ex.Index, pos, j, name})
			}
		}
		got := make([]*tiers.Lease, len(wants))
		errs := make([]error, len(wants))
		at := make([]time.Duration, len(wants)) // when each loaded get returned
		var wg sync.WaitGroup
		for i, w := range wants {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[i], errs[i] = g.cache.Get(ctx, g.matrixKey(w.name), tiers.VRAM)
				if got[i] != nil && got[i].Loaded {
					at[i] = time.Since(turn)
				}
			}()
		}
		wg.Wait()
		if first := slices.DeleteFunc(at, func(d time.Duration) bool { return d == 0 }); len(first) > 0 {
			pr.FirstCopy += slices.Min(first)
		}
		var leases []*tiers.Lease
		loads := 0 // matrices paged in: their copies run before the next choice (slack)
		for i, w := range wants {
			if got[i] != nil {
				leases = append(leases, got[i])
				if got[i].Loaded {
					loads++
				}
			}
			if errs[i] != nil && err == nil {
				err = fmt.Errorf("layer %d expert %d: %w", l, w.e, errs[i])
			}
		}
		if err != nil {
			releaseAll(leases)
			return nil, err
		}
		lap(&pr.PageWait)
		b = g.d.Batch()
		if cur == nil || len(wants) == 3*k {
			// Every chosen expert, in the router's order.
			var slots [3][]int
			for i, w := range wants {
				slots[w.j] = append(slots[w.j], got[i].Slot())
			}
			g.recordPaged(ctx, b, l, slots)
		} else if len(wants) > 0 {
			// The experts the GPU could not run: each at its place.
			var pos []int
			var slots [3][]int
			for i, w := range wants {
				if w.j == 0 {
					pos = append(pos, w.k)
				}
				slots[w.j] = append(slots[w.j], got[i].Slot())
			}
			g.recordAt(ctx, b, l, pos, slots)
		}
		if ahead == nil || ahead.l != l+1 {
			g.finishLayer(ctx, b, l) // else ahead starts with it
		}
		// The leases can end as soon as the dispatches are submitted: a
		// later upload into one of these slots is a copy on the same
		// queue, so it runs after them (one queue, in order).
		if ahead != nil && ahead.l == l+1 {
			var e *gpu.Encoded
			if e, err = b.Encode(ctx); err == nil {
				err = g.d.SubmitEncoded(ctx, e, ahead.enc) // drops both on an error
			} else {
				ahead.enc.Drop()
			}
			ahead.enc = nil // its held experts: until its rest is submitted, behind l+1's read-back
		} else {
			err = b.Submit(ctx)
		}
		releaseAll(leases)
		if err != nil {
			return nil, err
		}
		held = releaseAll(held)
		pr.Submits++
		lap(&pr.Record)
		pr.Turns++
		pr.Turn += mark.Sub(turn)
		slack = loads
		if loads == 0 {
			pr.TurnsHit++
			pr.TurnHit += mark.Sub(turn)
		}
		// The guesses are scored and the next layer's prefetched after the
		// submit: the GPU waits for nothing they do (their cache calls
		// took the lock that this layer's gets needed).
		g.score(idb)
		if predict {
			g.prefetch(l+1, both[idsPredOff:idsPredOff+k*4], both[idsGuessOff:])
		}
		b = g.d.Batch()
	}
	logitsAt := B["out"].Sub(0, uint64(c.VocabSize*4))
	if hd.logits || hd.sample {
		g.lmHead(ctx, b, logitsAt)
	}
	if hd.sample {
		// The kernel writes its own buffer (a dispatch cannot write the
		// buffer it reads), copied next to the layers' choices.
		tok := B["sampled"].Sub(0, 4)
		if hd.temperature <= 0 {
			g.k.Argmax(ctx, b, logitsAt, tok, c.VocabSize)
		} else {
			g.k.TopP(ctx, b, logitsAt, tok, ops.TopPShape{N: c.VocabSize, Temperature: float32(hd.temperature), TopP: float32(hd.topP), U: float32(hd.u)})
		}
		if err := b.Copy(B["out"].Sub(g.tokAt(), 4), tok); err != nil {
			return nil, err
		}
	}
	if err := section("head"); err != nil {
		return nil, err
	}
	// One read-back, in the head's submission: from the logits (or the
	// sampled token, or the first masked layer's choice) to the last
	// masked layer's choice. A submission of its own idled an H200 for
	// ~40 us before it and ~60 after it (experts/BENCHMARKS.md,
	// 2026-11-29, late).
	from, to := uint64(0), uint64(c.VocabSize*4)
	switch {
	case hd.logits:
	case hd.sample:
		from, to = g.tokAt(), g.tokAt()+4
	default:
		from, to = g.idsAt(0), g.idsAt(0)
	}
	if len(masked) > 0 {
		to = g.idsAt(masked[len(masked)-1]) + uint64(k*4)
		from = min(from, g.idsAt(masked[0]))
	}
	run.from, run.to, run.masked = from, to, masked
	if to > from {
		var err error
		if run.rd, err = b.SubmitRead(ctx, B["out"].Sub(from, to-from), int(to-from)); err != nil {
			return nil, err
		}
		pr.Readbacks++
	} else {
		if err := b.Submit(ctx); err != nil {
			return nil, err
		}
		if err := g.d.Sync(ctx); err != nil { // nothing to read: wait for the step
			return nil, err
		}
	}
	pr.Submits++
	lap(&pr.Record)
	pr.Steps++
	g.pos++
	run.turns = pr.TurnProfile.minus(before)
	return run, nil
}

// end collects a step begun by begin: it waits for its read-back, counts
// what its masked layers chose as VRAM hits (the paged path's count), and
// returns its logits (head.logits) and sampled token (head.sample). With
// count false (a step that generatePipelined discards) nothing is
// counted. A step ends once; a second end returns what the first did.
func (g *GPUModel) end(ctx context.Context, run *stepRun, count bool) ([]float32, int, error) {
	if run.ended {
		return run.logits, run.tok, run.err
	}
	run.ended = true
	run.logits, run.tok, run.err = g.collect(ctx, run, count)
	return run.logits, run.tok, run.err
}

func (g *GPUModel) collect(ctx context.Context, run *stepRun, count bool) ([]float32, int, error) {
	c := &g.m.Config
	k := c.NumExpertsPerTok
	pr := &g.Profile
	t := time.Now()
	defer func() { d := time.Since(t); pr.LogitsWait += d; pr.Total += d }()
	from, to := run.from, run.to
	buf := make([]byte, to-from)
	if run.rd != nil {
		if err := run.rd.Wait(ctx, buf); err != nil {
			return nil, 0, err
		}
	}
	if !count {
		return nil, 0, nil
	}
	at := func(off uint64) []byte { return buf[off-from:] } // buf holds [from, to) of out
	for _, l := range run.masked {
		// What the masked layers chose: count it as the paged path does.
		exs, err := g.chosen(l, at(g.idsAt(l))[:k*4])
		if err != nil {
			return nil, 0, err
		}
		for _, ex := range exs {
			for _, name := range ex.Tensors {
				g.cache.Touch(g.matrixKey(name), tiers.VRAM)
			}
		}
	}
	pr.MaskedLayers += len(run.masked)
	var logits []float32
	if run.hd.logits {
		logits = make([]float32, c.VocabSize)
		for i := range logits {
			logits[i] = math.Float32frombits(binary.LittleEndian.Uint32(at(uint64(4 * i))))
		}
	}
	tok := -1
	if run.hd.sample {
		tok = int(binary.LittleEndian.Uint32(at(g.tokAt())))
		if tok < 0 || tok >= c.VocabSize {
			return nil, 0, fmt.Errorf("experts: the GPU sampled token %d outside the vocabulary of %d", tok, c.VocabSize)
		}
	}
	return logits, tok, nil
}

// compile records one step's kernels into a batch that is never
// submitted: the pipelines they need compile now (tens of milliseconds
// each on some drivers), not during the first tokens.
func (g *GPUModel) compile(ctx context.Context) error {
	c := &g.m.Config
	B := g.buf
	h, ffn, k := c.HiddenSize, c.ExpertFFN(), c.NumExpertsPerTok
	b := g.d.Batch()
	g.pending = pendingAcc{}
	defer func() { g.pending = pendingAcc{} }() // the dry recording is dropped
	g.k.Embed(ctx, b, g.dense["model.embed_tokens.weight"], B["tok"], B["x"], ops.EmbedShape{Type: abi.Q4K, Tokens: 1, Dim: h, Vocab: c.VocabSize})
	g.embedNorm(ctx, b)
	g.recordAttention(ctx, b, 0)
	for l := 0; l < c.NumHiddenLayers; l++ {
		if !c.IsMoE(l) {
			g.normFFN(ctx, b, l) // as a step records it: with o's accumulate, pending from recordAttention
			g.ffn(ctx, b, fmt.Sprintf("model.layers.%d.mlp.", l), c.IntermediateSize)
			break
		}
	}
	for l := 0; l < c.NumHiddenLayers; l++ {
		if !c.IsMoE(l) {
			continue
		}
		p := fmt.Sprintf("model.layers.%d.", l)
		if !g.pending.set {
			// After a dense layer (which took o's accumulate into its
			// own norm): this layer's attention, so that its FFN norm
			// finds o's accumulate pending, as in a step.
			g.recordAttention(ctx, b, l)
		}
		g.normFFN(ctx, b, l)
		if g.routesBeside(l) {
			g.routeFFN(ctx, b, l, B["rlogits"], B["ids"], B["w"]) // the router beside the norm
		}
		g.router(ctx, b, l, B["xn"], B["rlogits"], B["ids"], B["w"], g.route(), g.fuseRouter && !g.partNorm) // layers' choices
		g.router(ctx, b, l, B["xn"], B["rlogits"], B["ids"], B["w"], g.route(), false)                       // the next layer's guess
		var slots [3][]int
		for j := range slots {
			slots[j] = make([]int, k)
		}
		g.recordPaged(ctx, b, l, slots)
		buf, _ := g.arena.Locate(0)
		n := min(c.Experts(), ops.MaxGroup)
		zeros, ids := make([]int, n), make([]int, n)
		for i := range ids {
			ids[i] = i
		}
		g.k.Q4KMatVecMasked(ctx, b, ops.Masked{Arena: buf, Slots: zeros, Experts: ids, Sel: B["ids"], K: k,
			X: B["xn"], SharedX: true, Y: B["gu"], YUpper: g.upOff(), Rows: ffn, Cols: h})
		g.k.Q4KMatVecMasked(ctx, b, ops.Masked{Arena: buf, Slots: zeros, Experts: ids, Sel: B["ids"], K: k,
			X: B["act"], Y: B["y"], Rows: h, Cols: ffn})
		g.k.Q4KMatVecMaskedSwiGLU(ctx, b, ops.Masked{Arena: buf, Slots: zeros, Experts: ids, Sel: B["ids"], K: k,
			X: B["gu"], Y: B["y"], Rows: h, Cols: ffn}, g.upOff())
		if g.partNorm {
			g.k.MatVecNormed(ctx, b, g.dense[p+"mlp.gate.weight"], g.normed, B["rlogits"], c.Experts(), h)
			g.k.Q4KMatVecMasked(ctx, b, ops.Masked{Arena: buf, Slots: zeros, Experts: ids, Sel: B["ids"], K: k,
				SharedX: true, Y: B["gu"], YUpper: g.upOff(), Rows: ffn, Cols: h, Normed: g.normed})
		}
		if g.glu {
			// The gate and up products together: masked (and handed the
			// norm), and one missing expert's (recordAt).
			m := min(c.Experts(), ops.MaxGroup/2)
			gm := ops.Masked{Arena: buf, Slots: zeros[:m], UpSlots: zeros[:m], Experts: ids[:m], Sel: B["ids"], K: k,
				X: B["xn"], SharedX: true, Y: B["act"], Rows: ffn, Cols: h}
			g.k.Q4KMatVecMasked(ctx, b, gm)
			if g.partNorm {
				gm.Normed = g.normed
				g.k.Q4KMatVecMasked(ctx, b, gm)
			}
			if g.xq {
				// And of quantized x: masked gate and up, masked down.
				gm.X, gm.XQ = g.ffnX(l), true
				g.k.Q4KMatVecMasked(ctx, b, gm)
				g.k.Q4KMatVecMasked(ctx, b, ops.Masked{Arena: buf, Slots: zeros, Experts: ids, Sel: B["ids"], K: k,
					X: g.downX(ctx, b, 0, k, false), Y: B["y"], Rows: h, Cols: ffn, XQ: true})
				if g.gluYQ() {
					gm.YQ = g.actq(0, k)
					g.k.Q4KMatVecMasked(ctx, b, gm)
				}
			}
			g.gluGroup(ctx, b, l, slots[0][:1], slots[1][:1], 0)
			if g.xq {
				// recordAt's down product of one missing expert, and the
				// gate and up products apart (an expert's matrices in two
				// arena buffers), grouped and masked, of quantized x.
				g.group(ctx, b, slots[2][:1], g.downX(ctx, b, 0, 1, false), true, true, B["y"], 0, h, ffn)
				g.group(ctx, b, slots[0][:1], g.ffnX(l), true, true, B["gu"], 0, ffn, h)
				g.k.Q4KMatVecMasked(ctx, b, ops.Masked{Arena: buf, Slots: zeros, Experts: ids, Sel: B["ids"], K: k,
					X: g.ffnX(l), SharedX: true, Y: B["gu"], YUpper: g.upOff(), Rows: ffn, Cols: h, XQ: true})
			}
		}
		g.finishLayer(ctx, b, l) // and the shared experts, if any; its accumulate pending for the LM head's norm
		break
	}
	logitsAt := B["out"].Sub(0, uint64(c.VocabSize*4))
	g.lmHead(ctx, b, logitsAt)
	// Both samplers, so that no generated token compiles one.
	g.k.Argmax(ctx, b, logitsAt, B["sampled"].Sub(0, 4), c.VocabSize)
	g.k.TopP(ctx, b, logitsAt, B["sampled"].Sub(0, 4), ops.TopPShape{N: c.VocabSize, Temperature: 1, TopP: 0.9, U: 0.5})
	err := b.Err()
	b.Drop()
	return err
}

// upOff is where the up products start in the gu buffer (gate products
// first): a storage binding's offset alignment past them.
func (g *GPUModel) upOff() int {
	c := &g.m.Config
	return (c.NumExpertsPerTok*c.ExpertFFN()*4 + 255) / 256 * 256
}

// maskedPerSubmit is how many masked layers a step not recorded ahead
// records before it submits them, so that the GPU works while the host
// records the rest (recording a Mixtral-shaped layer takes about as long
// as running it).
const maskedPerSubmit = 4

// idsAt is where, in the out buffer, the router writes layer l's choice
// when the layer runs masked: after the logits, 256 bytes a layer (a
// storage binding's offset alignment).
func (g *GPUModel) idsAt(l int) uint64 {
	return g.tokAt() + 256 + uint64(l)*256
}

// tokAt is where, in the out buffer, a step's sampled token goes: after
// the logits, before the layers' choices (one read-back takes it and
// them).
func (g *GPUModel) tokAt() uint64 {
	return (uint64(g.m.Config.VocabSize*4) + 255) / 256 * 256
}

// recordAttention records layer l's attention: x += attention(x) at the
// current position (with partNorm, the accumulate also hands the FFN's
// norm of x to g.normed; else normFFN records it into xn).
func (g *GPUModel) recordAttention(ctx context.Context, b *gpu.Batch, l int) {
	c := &g.m.Config
	B := g.buf
	h, hd := c.HiddenSize, c.HeadDimension()
	nq, nkv := c.NumAttentionHeads, c.NumKeyValueHeads
	p := fmt.Sprintf("model.layers.%d.", l)
	normed := g.partNorm && g.qkv[l] != nil // the norm handed over to the q k v product
	xq := g.xqAttn && g.qkv[l] != nil       // the q k v product of the norm quantized
	norm := g.rowNorm()
	switch {
	case xq:
		g.normXQ(ctx, b, g.residual(l), p+"input_layernorm.weight", norm)
	case !normed:
		g.normX(ctx, b, g.residual(l), p+"input_layernorm.weight")
	}
	q := gpu.Region(B["q"])
	attn := ops.AttnShape{Heads: nq, KVHeads: nkv, HeadDim: hd, KVLen: g.pos + 1, Scale: float32(1 / math.Sqrt(float64(hd)))}
	if w := g.qkv[l]; w != nil {
		// q, k and v in one product, then RoPE on q and k and k and v
		// into the cache at this position in one dispatch: the
		// attention's split (ropeAttn) or one before it.
		qkv := B["qkv"]
		switch {
		case normed:
			g.k.Q4KMatVecNormed(ctx, b, w, g.normed, qkv, (nq+2*nkv)*hd, h)
		case xq:
			g.k.Q4KMatVecXQ(ctx, b, w, g.gateX(), qkv, (nq+2*nkv)*hd, h)
		default:
			g.k.Q4KMatVec(ctx, b, w, B["xn"], qkv, (nq+2*nkv)*hd, h)
		}
		rs := ops.RopeShape{Tokens: 1, Heads: nq + nkv, HeadDim: hd, RotDim: hd, Pos0: g.pos, Style: abi.RopeNeoX}
		kv := ops.KVShape{Dim: nkv * hd, KOff: nq * hd, VOff: (nq + nkv) * hd, Pos: g.pos}
		if g.ropeAttn && !g.fuseO {
			var attq gpu.Region
			if g.quantizedO() {
				attq = B["attq"].Sub(0, ops.XQBytes(nq*hd))
			}
			g.k.RopeAttention(ctx, b, qkv, B["freqs"], g.kc[l], g.vc[l], B["att"], attq, attn, rs, kv)
			g.recordO(ctx, b, l, attq)
			return
		}
		g.k.RopeKV(ctx, b, qkv, B["freqs"], g.kc[l], g.vc[l], rs, kv)
		q = qkv.Sub(0, uint64(nq*hd*4))
	} else {
		kvRow := uint64(nkv * hd * 4)
		ks := g.kc[l].Sub(uint64(g.pos)*kvRow, kvRow)
		vs := g.vc[l].Sub(uint64(g.pos)*kvRow, kvRow)
		g.k.Q4KMatVec(ctx, b, g.dense[p+"self_attn.q_proj.weight"], B["xn"], B["q"], nq*hd, h)
		g.k.Q4KMatVec(ctx, b, g.dense[p+"self_attn.k_proj.weight"], B["xn"], ks, nkv*hd, h)
		g.k.Q4KMatVec(ctx, b, g.dense[p+"self_attn.v_proj.weight"], B["xn"], vs, nkv*hd, h)
		g.k.Rope(ctx, b, B["q"], B["freqs"], ops.RopeShape{Tokens: 1, Heads: nq, HeadDim: hd, RotDim: hd, Pos0: g.pos, Style: abi.RopeNeoX})
		g.k.Rope(ctx, b, ks, B["freqs"], ops.RopeShape{Tokens: 1, Heads: nkv, HeadDim: hd, RotDim: hd, Pos0: g.pos, Style: abi.RopeNeoX})
	}
	if g.quantizedO() {
		// The o product of the attention's output quantized by its merge.
		attq := B["attq"].Sub(0, ops.XQBytes(nq*hd))
		g.k.AttentionXQ(ctx, b, q, g.kc[l], g.vc[l], B["att"], attq, attn)
		g.recordO(ctx, b, l, attq)
		return
	}
	g.k.Attention(ctx, b, q, g.kc[l], g.vc[l], B["att"], attn)
	if g.fuseO {
		g.flushAcc(ctx, b)
		g.k.Q4KMatVecAdd(ctx, b, g.dense[p+"self_attn.o_proj.weight"], B["att"], B["x"], h, nq*hd) // x += Wo att
		return
	}
	g.recordO(ctx, b, l, nil)
}

// recordO records layer l's o product of the attention's output (att, or
// attq quantized if not nil) and its accumulate into x.
func (g *GPUModel) recordO(ctx context.Context, b *gpu.Batch, l int, attq gpu.Region) {
	c := &g.m.Config
	B := g.buf
	h, nqd := c.HiddenSize, c.NumAttentionHeads*c.HeadDimension()
	p := fmt.Sprintf("model.layers.%d.", l)
	if attq != nil {
		g.k.Q4KMatVecXQ(ctx, b, g.dense[p+"self_attn.o_proj.weight"], attq, B["o"], h, nqd)
		g.accumulate(ctx, b, B["o"], B["ones"], ops.AccumShape{Experts: 1, Dim: h})
		return
	}
	g.k.Q4KMatVec(ctx, b, g.dense[p+"self_attn.o_proj.weight"], B["att"], B["o"], h, nqd)
	if g.partNorm {
		// x and the FFN's norm of it.
		g.k.AccumulateNorm(ctx, b, B["o"], B["ones"], B["x"], g.dense[p+"post_attention_layernorm.weight"], g.normed, ops.AccumShape{Experts: 1, Dim: h})
	} else {
		g.accumulate(ctx, b, B["o"], B["ones"], ops.AccumShape{Experts: 1, Dim: h})
	}
}

// embedNorm hands the first layer's norm of the embedding in x to its q
// k v product (partNorm): an accumulate of nothing into x.
func (g *GPUModel) embedNorm(ctx context.Context, b *gpu.Batch) {
	if g.partNorm {
		B := g.buf
		g.k.AccumulateNorm(ctx, b, B["ones"], B["ones"], B["x"], g.dense["model.layers.0.input_layernorm.weight"], g.normed, ops.AccumShape{Dim: g.m.Config.HiddenSize})
	}
}

// normFFN records layer l's FFN input (ffnNorm) and, for a MoE layer
// with l2Router, the prefetch of its router's weights beside it, for the
// router's product after it.
func (g *GPUModel) normFFN(ctx context.Context, b *gpu.Batch, l int) {
	g.ffnNorm(ctx, b, l)
	g.prefetchRouter(ctx, b, l)
}

// ffnNorm records xn = the FFN's RMSNorm of x. With xq, a MoE layer's xn
// is also quantized into xnq for the gate and up products, by the same
// dispatch; with routeNorm (routesBeside) into the layer's own buffers,
// x + o into its x2 and x left as it was (for its router, routeFFN).
func (g *GPUModel) ffnNorm(ctx context.Context, b *gpu.Batch, l int) {
	c := &g.m.Config
	if g.routesBeside(l) {
		p := g.pending
		g.pending = pendingAcc{}
		if !p.set || p.shape.Experts != 1 {
			b.Fail(fmt.Errorf("experts: layer %d: the FFN norm beside the router found no o accumulate pending", l))
			return
		}
		f := g.ffnBufs[l]
		g.k.AccumulateRMSNormXQTo(ctx, b, p.src, p.wts, g.buf["x"], f.norm, f.xn, f.xnq, f.x2, p.shape, float32(c.RMSNormEps))
		return
	}
	weight := fmt.Sprintf("model.layers.%d.post_attention_layernorm.weight", l)
	if g.xq && c.IsMoE(l) {
		g.normXQ(ctx, b, g.buf["x"], weight, g.rowNorm())
	} else {
		g.normX(ctx, b, g.buf["x"], weight)
	}
}

// prefetchRouter records the read of MoE layer l's router weights into
// the L2 cache (l2Router): beside the dispatch recorded before it, which
// it binds nothing of.
func (g *GPUModel) prefetchRouter(ctx context.Context, b *gpu.Batch, l int) {
	if r := g.routerL2[l]; r.sink != nil && g.l2Router {
		g.k.L2Prefetch(ctx, b, r.weights, r.sink)
	}
}

// ffnBuf is what a MoE layer's FFN norm writes with routeNorm: the new
// x (x + o) for the next layer's norm, the norm's output (read by none:
// the kernel writes it) and its quantized copy for the experts' gate and
// up products. Buffers of the layer's own: a dispatch that writes a
// buffer used before it in the command buffer gets a barrier, and a
// barrier waits for all the work recorded before it (the router beside
// it). And the layer's router and norm weights, resolved at load: the
// step records them a layer each.
type ffnBuf struct {
	x2, xn, xnq  *gpu.Buffer
	router, norm *gpu.Buffer
}

// canRouteNorm reports whether a model's MoE layers can run routeNorm:
// Mixtral's softmax routing of at most ops.MaxRouterNormExperts experts,
// no shared experts, a hidden size a thread a group of 16 covers.
func canRouteNorm(c *Config) bool {
	h := c.HiddenSize
	return c.ScoringFunc != "sigmoid" && c.NumSharedExperts == 0 && c.Experts() <= ops.MaxRouterNormExperts &&
		h%ops.XQGroup == 0 && h <= ops.MaxRouterNormCols
}

// routesBeside reports whether MoE layer l's router runs beside its FFN
// norm (routeNorm): where the model can, with the forms it needs (the
// experts' x quantized, the o product's accumulate deferred to the norm,
// the router's product in its routing dispatch, nothing handed over or
// fused that writes x otherwise).
func (g *GPUModel) routesBeside(l int) bool {
	return g.routeNorm && g.ffnBufs != nil && g.ffnBufs[l] != nil && g.xq && g.accNorm && g.fuseRouter && !g.partNorm && !g.fuseO
}

// residual is where x is before layer l's attention norm (l = the layer
// count: the final norm's): the x2 of the MoE layer before it with
// routeNorm, which that norm reads back into x, else x.
func (g *GPUModel) residual(l int) *gpu.Buffer {
	if l > 0 && g.routesBeside(l-1) {
		return g.ffnBufs[l-1].x2
	}
	return g.buf["x"]
}

// ffnX is what MoE layer l's gate and up products read: its FFN norm's
// output (gateX), from the layer's own buffer with routeNorm.
func (g *GPUModel) ffnX(l int) gpu.Region {
	if g.routesBeside(l) {
		return g.ffnBufs[l].xnq.Sub(0, ops.XQBytes(g.m.Config.HiddenSize))
	}
	return g.gateX()
}

// routeFFN records MoE layer l's router with routeNorm: its choice from
// the norm of x + o that it computes itself (ops.RouterRouteNorm), into
// logits, ids and weights. A resident layer records it before the FFN
// norm (ffnNorm): it takes the barrier behind the o product, and the
// norm, which writes only the layer's own buffers and reads what the
// router reads, runs beside it. A paged layer records it after the norm
// (recordChoice), reading the same x and o.
func (g *GPUModel) routeFFN(ctx context.Context, b *gpu.Batch, l int, logits, ids, weights gpu.Region) {
	c := &g.m.Config
	f := g.ffnBufs[l]
	g.k.RouterRouteNorm(ctx, b, f.router, g.buf["x"], g.buf["o"], f.norm, logits, ids, weights, g.route(), c.HiddenSize, float32(c.RMSNormEps))
}

// l2Read is a read of weights into the L2 cache (ops.L2Prefetch) and
// the sink of its own that it binds.
type l2Read struct {
	weights gpu.Region
	sink    *gpu.Buffer
}

// maxL2Router bounds the router weights that l2Router prefetches: a
// Mixtral router is 128 KB; DeepSeek-V3's 7 MB would load the memory
// system under the norm as the q k v weights did.
const maxL2Router = 1 << 20

// pendingAcc is an accumulate into x not recorded yet (see accNorm).
type pendingAcc struct {
	src, wts gpu.Region
	shape    ops.AccumShape
	set      bool
}

// accumulate records x += the weighted sum of a.Experts vectors of src
// (ops.Accumulate), or with accNorm leaves it to the next norm of x.
func (g *GPUModel) accumulate(ctx context.Context, b *gpu.Batch, src, wts gpu.Region, a ops.AccumShape) {
	g.flushAcc(ctx, b)
	if g.accNorm && g.xq && a.Experts <= ops.MaxAccumNormExperts {
		g.pending = pendingAcc{src: src, wts: wts, shape: a, set: true}
		return
	}
	g.k.Accumulate(ctx, b, src, wts, g.buf["x"], a)
}

// flushAcc records the pending accumulate, if any: before anything but
// a norm (normXQ, normX, which take it in) reads or writes x.
func (g *GPUModel) flushAcc(ctx context.Context, b *gpu.Batch) {
	if p := g.pending; p.set {
		g.pending = pendingAcc{}
		g.k.Accumulate(ctx, b, p.src, p.wts, g.buf["x"], p.shape)
	}
}

// normXQ records xn = the RMSNorm of x with the dense weight named weight,
// and xn quantized into xnq (ops.RMSNormXQ), adding the pending
// accumulate into x first in the same dispatch (ops.AccumulateRMSNormXQ).
//
// x is where x is now (residual): another buffer than x's only with an
// accumulate pending, which then goes with it into x.
func (g *GPUModel) normXQ(ctx context.Context, b *gpu.Batch, x *gpu.Buffer, weight string, s ops.NormShape) {
	B := g.buf
	p := g.pending
	g.pending = pendingAcc{}
	switch {
	case p.set && x != B["x"]:
		g.k.AccumulateRMSNormXQTo(ctx, b, p.src, p.wts, x, g.dense[weight], B["xn"], g.gateX(), B["x"], p.shape, s.Eps)
	case p.set:
		g.k.AccumulateRMSNormXQ(ctx, b, p.src, p.wts, B["x"], g.dense[weight], B["xn"], g.gateX(), p.shape, s.Eps)
	case x != B["x"]:
		b.Fail(fmt.Errorf("experts: the norm of %s found x in a layer's x2 and no accumulate to bring it back", weight))
	default:
		g.k.RMSNormXQ(ctx, b, B["x"], g.dense[weight], B["xn"], g.gateX(), s)
	}
}

// gateX is what the gate and up products read: xn, or with xq xnq.
func (g *GPUModel) gateX() gpu.Region {
	if g.xq {
		return g.buf["xnq"].Sub(0, ops.XQBytes(g.m.Config.HiddenSize))
	}
	return g.buf["xn"]
}

// downX returns what the down products of the experts at places from..to
// of the router's choice read: their rows of act, or with xq those rows
// quantized into actq by a dispatch it records.
//
// quantized says that the gate and up products wrote those rows of actq
// themselves (gluYQ): no dispatch then.
func (g *GPUModel) downX(ctx context.Context, b *gpu.Batch, from, to int, quantized bool) gpu.Region {
	ffn := g.m.Config.ExpertFFN()
	act := g.buf["act"].Sub(uint64(from*ffn*4), uint64((to-from)*ffn*4))
	if !g.xq {
		return act
	}
	q := g.actq(from, to)
	if !quantized {
		g.k.QuantizeX(ctx, b, act, q, (to-from)*ffn)
	}
	return q
}

// actq is the quantized act of the experts at places from..to of the
// router's choice.
func (g *GPUModel) actq(from, to int) gpu.Span {
	ffn := g.m.Config.ExpertFFN()
	return g.buf["actq"].Sub(uint64(from)*ops.XQBytes(ffn), uint64(to-from)*ops.XQBytes(ffn))
}

// gluYQ reports whether the experts' gate and up products hand their
// output to the down products quantized themselves (ops.GLUQuantizesY,
// for the layout of the k chosen that every dispatch of them takes): with
// xq, where the shape allows it.
func (g *GPUModel) gluYQ() bool {
	c := &g.m.Config
	return g.xq && g.yq && ops.GLUQuantizesY(c.ExpertFFN(), c.HiddenSize, c.NumExpertsPerTok)
}

// quantizedHead reports whether the LM head reads the final norm
// quantized: with every product of quantized x (xqAttn, which only a
// model whose forms allow quantized x has: canXQ), as the layers'
// products. Its float x took 52 us a step on an H200, at ~0.35 of copy
// (experts/BENCHMARKS.md, 2026-11-29, night).
func (g *GPUModel) quantizedHead() bool { return g.xqAttn && g.xqHead }

// rowNorm is the shape of an RMSNorm of one hidden-state row.
func (g *GPUModel) rowNorm() ops.NormShape {
	c := &g.m.Config
	return ops.NormShape{Rows: 1, Dim: c.HiddenSize, Eps: float32(c.RMSNormEps)}
}

// quantizedO reports whether the o product reads the attention's output
// quantized (by the attention's merge): with xqAttn, o not added into x
// by its own product, and whole groups a head.
func (g *GPUModel) quantizedO() bool {
	return g.xqAttn && !g.fuseO && g.m.Config.HeadDimension()%ops.XQGroup == 0
}

// normX records xn = the RMSNorm of x with the dense weight named weight,
// adding the pending accumulate into x first in the same dispatch
// (normXQ's ops.AccumulateRMSNormXQ). Its quantized copy of xn goes to xnq, which
// nothing reads before it is written again: every reader of xnq (a
// layer's gate and up products, but with routeNorm the layer's own copy,
// and with xqAttn its q k v product) follows a normXQ of that layer. An
// accumulate is pending only with xq (accumulate), so xnq is then another
// buffer than xn.
func (g *GPUModel) normX(ctx context.Context, b *gpu.Batch, x *gpu.Buffer, weight string) {
	s := g.rowNorm()
	if g.pending.set || x != g.buf["x"] {
		g.normXQ(ctx, b, x, weight, s)
		return
	}
	g.k.RMSNorm(ctx, b, g.buf["x"], g.dense[weight], g.buf["xn"], s)
}

// lmHead records the logits: the LM head of the final norm of x, of
// that norm quantized with quantizedHead.
func (g *GPUModel) lmHead(ctx context.Context, b *gpu.Batch, logits gpu.Region) {
	c := &g.m.Config
	if g.partNorm {
		g.k.Q4KMatVecNormed(ctx, b, g.dense["lm_head.weight"], g.normed, logits, c.VocabSize, c.HiddenSize)
		return
	}
	if g.quantizedHead() {
		g.normXQ(ctx, b, g.residual(c.NumHiddenLayers), "model.norm.weight", g.rowNorm())
		g.k.Q4KMatVecXQ(ctx, b, g.dense["lm_head.weight"], g.gateX(), logits, c.VocabSize, c.HiddenSize)
		return
	}
	g.normX(ctx, b, g.residual(c.NumHiddenLayers), "model.norm.weight")
	g.k.Q4KMatVec(ctx, b, g.dense["lm_head.weight"], g.buf["xn"], logits, c.VocabSize, c.HiddenSize)
}

// recordChoice records layer l's router on xn (with routeNorm on x + o,
// routeFFN) and its routing into the ids buffer, and, with prefetch on
// and a MoE layer after it, that layer's router on this hidden state: the
// guess of its experts, read back with the choice. It reports whether it
// recorded the guess.
func (g *GPUModel) recordChoice(ctx context.Context, b *gpu.Batch, l int) bool {
	c := &g.m.Config
	B, k := g.buf, c.NumExpertsPerTok
	// Fused as a masked layer's (fuseRouter): the same logits' bits
	// whether the layer runs masked or paged.
	if g.routesBeside(l) {
		g.routeFFN(ctx, b, l, B["rlogits"], B["ids"], B["w"])
	} else {
		g.router(ctx, b, l, B["xn"], B["rlogits"], B["ids"], B["w"], g.route(), g.fuseRouter && !g.partNorm)
	}
	predict := g.Prefetch && l+1 < c.NumHiddenLayers && c.IsMoE(l+1)
	if predict {
		// Layer l+1's router on this hidden state (x, or with routeNorm
		// the layer's x2: x + o), normalized as l+1 will normalize its
		// own: the guess of its experts.
		q := fmt.Sprintf("model.layers.%d.", l+1)
		g.flushAcc(ctx, b)
		g.k.RMSNorm(ctx, b, g.residual(l+1), g.dense[q+"post_attention_layernorm.weight"], B["pxn"], g.rowNorm())
		g.router(ctx, b, l+1, B["pxn"], B["plogits"], B["ids"].Sub(idsPredOff, uint64(k*4)), B["pw"], g.route(), false)
		// Its logits beside it, read back with it: how sure the guess is.
		n := uint64(c.Experts() * 4)
		if err := b.Copy(B["ids"].Sub(idsGuessOff, n), B["plogits"].Sub(0, n)); err != nil {
			b.Fail(err)
		}
	}
	return predict
}

// router records MoE layer l's router on x (its logits into logits) and
// the routing r of them into ids and weights: with fused, in one dispatch
// (ops.RouterRoute) when the layer has at most ops.MaxRouterExperts
// experts; else the product and a Route.
func (g *GPUModel) router(ctx context.Context, b *gpu.Batch, l int, x, logits, ids, weights gpu.Region, r ops.RouteShape, fused bool) {
	c := &g.m.Config
	w := g.dense[fmt.Sprintf("model.layers.%d.mlp.gate.weight", l)]
	if fused && c.Experts() <= ops.MaxRouterExperts && c.HiddenSize%4 == 0 {
		g.k.RouterRoute(ctx, b, w, x, logits, nil, ids, weights, r, c.HiddenSize)
		return
	}
	g.k.MatVec(ctx, b, abi.F32, w, x, logits, c.Experts(), c.HiddenSize)
	g.k.Route(ctx, b, logits, nil, ids, weights, r)
}

// resident reports whether every expert matrix of MoE layer l is in VRAM
// now (the layer would run masked, with no read-back), holding nothing.
func (g *GPUModel) resident(l int) bool {
	for e := 0; e < g.m.Config.Experts(); e++ {
		ex, ok := g.m.Expert(l, e)
		if !ok {
			return false
		}
		for _, name := range ex.Tensors {
			if !g.cache.Has(g.matrixKey(name), tiers.VRAM) {
				return false
			}
		}
	}
	return true
}

// recordPaged records a MoE layer's experts from the arena slots of the
// chosen ones (gate, up and down matrices, in the router's order), up to
// their outputs in y (finishLayer adds them into x).
func (g *GPUModel) recordPaged(ctx context.Context, b *gpu.Batch, l int, slots [3][]int) {
	c := &g.m.Config
	B := g.buf
	h, ffn, k := c.HiddenSize, c.ExpertFFN(), c.NumExpertsPerTok
	up := uint64(g.upOff())
	ran, quantized := g.gluGroup(ctx, b, l, slots[0], slots[1], 0)
	if !ran {
		g.group(ctx, b, slots[0], g.ffnX(l), true, g.xq, B["gu"], 0, ffn, h)
		g.group(ctx, b, slots[1], g.ffnX(l), true, g.xq, B["gu"], up, ffn, h)
		g.k.SwiGLU(ctx, b, B["gu"].Sub(0, uint64(k*ffn*4)), B["gu"].Sub(up, uint64(k*ffn*4)), B["act"], k*ffn)
	}
	g.group(ctx, b, slots[2], g.downX(ctx, b, 0, len(slots[2]), quantized), false, g.xq, B["y"], 0, h, ffn)
}

// gluGroup records, with glu, the gate and up products of the experts
// whose matrices are at arena slots gates and ups (the same order) into
// act from place at of the router's choice, silu(gate) * up, in one
// dispatch; it records nothing and returns false without glu, for more
// than MaxGroup/2 experts, or if their matrices lie in several arena
// buffers. quantized reports that it wrote their rows of actq too.
func (g *GPUModel) gluGroup(ctx context.Context, b *gpu.Batch, l int, gates, ups []int, at int) (ran, quantized bool) {
	if !g.glu || len(gates) > ops.MaxGroup/2 {
		return false, false
	}
	c := &g.m.Config
	h, ffn := c.HiddenSize, c.ExpertFFN()
	buf0, _ := g.arena.Locate(gates[0])
	gi, ui := make([]int, len(gates)), make([]int, len(ups))
	for i := range gates {
		var gb, ub *gpu.Buffer
		gb, gi[i] = g.arena.Locate(gates[i])
		ub, ui[i] = g.arena.Locate(ups[i])
		if gb != buf0 || ub != buf0 {
			return false, false
		}
	}
	grp := ops.Group{Arena: buf0, Slots: gi, UpSlots: ui, X: g.ffnX(l), SharedX: true,
		Y: g.buf["act"].Sub(uint64(at*ffn*4), uint64(len(gates)*ffn*4)), Rows: ffn, Cols: h, XQ: g.xq, K: c.NumExpertsPerTok}
	if g.gluYQ() {
		grp.YQ = g.actq(at, at+len(gates))
	}
	g.k.Q4KMatVecGroup(ctx, b, grp)
	return true, grp.YQ != nil
}

// recordAt records the experts at places pos of the router's choice from
// the arena slots of their gate, up and down matrices, into their rows of
// y, after products of the others already ran (encodeAhead's): their
// SwiGLU output goes to their own rows of act only (the others' may come
// from a GLU product, with nothing of theirs in gu).
func (g *GPUModel) recordAt(ctx context.Context, b *gpu.Batch, l int, pos []int, slots [3][]int) {
	c := &g.m.Config
	B := g.buf
	h, ffn := c.HiddenSize, c.ExpertFFN()
	up := uint64(g.upOff())
	quantized := make([]bool, len(pos))
	for i, at := range pos {
		var ran bool
		if ran, quantized[i] = g.gluGroup(ctx, b, l, slots[0][i:i+1], slots[1][i:i+1], at); ran {
			continue
		}
		row := uint64(at * ffn * 4)
		g.group(ctx, b, slots[0][i:i+1], g.ffnX(l), true, g.xq, B["gu"], row, ffn, h)
		g.group(ctx, b, slots[1][i:i+1], g.ffnX(l), true, g.xq, B["gu"], up+row, ffn, h)
		g.k.SwiGLU(ctx, b, B["gu"].Sub(row, uint64(ffn*4)), B["gu"].Sub(up+row, uint64(ffn*4)), B["act"].Sub(row, uint64(ffn*4)), ffn)
	}
	for i, at := range pos {
		g.group(ctx, b, slots[2][i:i+1], g.downX(ctx, b, at, at+1, quantized[i]), true, g.xq, B["y"], uint64(at*h*4), h, ffn)
	}
}

// finishLayer adds MoE layer l's expert outputs, weighted, into x, and
// runs its shared experts; with partNorm (no shared experts then) the
// accumulate also hands the next norm of x (the next layer's, or the
// final one) to g.normed.
func (g *GPUModel) finishLayer(ctx context.Context, b *gpu.Batch, l int) {
	c := &g.m.Config
	B := g.buf
	if g.partNorm {
		// x and the next norm of it: the next layer's, or the final one.
		next := "model.norm.weight"
		if l+1 < c.NumHiddenLayers {
			next = fmt.Sprintf("model.layers.%d.input_layernorm.weight", l+1)
		}
		g.k.AccumulateNorm(ctx, b, B["y"], B["w"], B["x"], g.dense[next], g.normed, ops.AccumShape{Experts: c.NumExpertsPerTok, Dim: c.HiddenSize})
		return
	}
	g.accumulate(ctx, b, B["y"], B["w"], ops.AccumShape{Experts: c.NumExpertsPerTok, Dim: c.HiddenSize})
	if c.NumSharedExperts > 0 {
		g.ffn(ctx, b, fmt.Sprintf("model.layers.%d.mlp.shared_experts.", l), c.ExpertFFN()*c.NumSharedExperts)
	}
}

// aheadLayer is MoE layer l encoded while the GPU runs layer l-1 (the
// layer before it in the step): l-1's accumulate, then l's attention,
// router and choice, and the products of l's experts that were resident
// (held, so that nothing evicts them before they are submitted), computed
// on the GPU for whichever of them the router chooses: encoded apart
// (rest), so that the choice's read-back does not wait for them.
type aheadLayer struct {
	l   int
	enc *gpu.Encoded
	// rest is the resident experts' products, encoded apart: submitted
	// after the read-back of the choice has started, so that the choice
	// comes back while the GPU runs them (a read-back waits for all work
	// submitted before it) and the host pages the misses in meanwhile.
	rest    *gpu.Encoded
	predict bool
	held    []*tiers.Lease
	experts []int // those held (their matrices in held, in order): their products run if chosen
}

func (a *aheadLayer) release() {
	if a != nil {
		a.held = releaseAll(a.held)
	}
}

func (a *aheadLayer) drop() {
	if a != nil {
		a.enc.Drop()
		a.rest.Drop()
		a.release()
	}
}

// encodeAhead encodes layer l (MoE, after layer prev) into an aheadLayer.
// It holds the resident matrices of l's experts, as many as leave the
// VRAM level room for prev's own misses beside the busy slots held now.
// With fixed non-nil (l's fixed part, encoded earlier by encodeFixed)
// only the products of the resident experts are encoded here.
func (g *GPUModel) encodeAhead(ctx context.Context, prev, l, busy int, fixed *fixedLayer) (*aheadLayer, error) {
	c := &g.m.Config
	B := g.buf
	k := c.NumExpertsPerTok
	a := &aheadLayer{l: l}
	if fixed == nil {
		var err error
		if fixed, err = g.encodeFixed(ctx, prev, l); err != nil {
			return nil, err
		}
	} else {
		g.Profile.Early++
	}
	a.enc, a.predict = fixed.enc, fixed.predict
	// At most this many held: the rest of the slots must take prev's
	// misses (every matrix of its chosen experts) twice over. And at most
	// 2*MaxGroup experts: each adds masked products that run on the GPU
	// for nothing unless chosen (a model of hundreds of experts, k of them
	// chosen, holds the first ones resident; the others are paged after
	// the choice, as when none is held).
	room := g.arena.Slots() - busy - 2*3*k
	for e := 0; e < c.Experts() && len(a.held)+3 <= room && len(a.experts) < 2*ops.MaxGroup; e++ {
		ex, ok := g.m.Expert(l, e)
		if !ok || len(ex.Tensors) != 3 {
			break
		}
		var ls []*tiers.Lease
		for _, name := range ex.Tensors {
			if lease := g.cache.Hold(g.matrixKey(name), tiers.VRAM); lease != nil {
				ls = append(ls, lease)
			}
		}
		if len(ls) < 3 {
			releaseAll(ls) // an expert runs here whole or not at all
			continue
		}
		a.held = append(a.held, ls...)
		a.experts = append(a.experts, e)
	}
	if len(a.experts) > 0 {
		rb := g.d.Batch()
		g.recordMaskedProducts(ctx, rb, l, a.experts, a.held, B["ids"].Sub(0, uint64(k*4)), false)
		var err error
		if a.rest, err = rb.Encode(ctx); err != nil {
			a.drop()
			return nil, err
		}
	}
	return a, nil
}

// A fixedLayer is the part of an aheadLayer that does not depend on what
// VRAM holds: the accumulate of the layer before it, its attention,
// router and choice (and the next layer's guess: predict).
type fixedLayer struct {
	enc     *gpu.Encoded
	predict bool
}

// maxEarly bounds how many layers past the next one get their fixed parts
// encoded early (each holds a command buffer and its scratch until it is
// submitted, or dropped when its layer comes without using it).
const maxEarly = 4

// encodeFixed encodes MoE layer l's fixed part (after layer prev).
func (g *GPUModel) encodeFixed(ctx context.Context, prev, l int) (*fixedLayer, error) {
	nb := g.d.Batch()
	g.finishLayer(ctx, nb, prev)
	g.recordAttention(ctx, nb, l)
	g.normFFN(ctx, nb, l)
	predict := g.recordChoice(ctx, nb, l)
	enc, err := nb.Encode(ctx)
	if err != nil {
		return nil, err
	}
	return &fixedLayer{enc: enc, predict: predict}, nil
}

// fusions reads RDRR_GPU_FUSE: which fused forms the decode step uses
// (the o product adding into the residual; the down products computing
// SwiGLU themselves).
func fusions(env string) (o, swiglu bool) {
	switch env {
	case "1", "all":
		return true, true
	case "o":
		return true, false
	case "swiglu":
		return false, true
	}
	return false, false
}

// groupExperts declares to the cache the matrices that one dispatch
// reads (recordMasked): per MoE layer, all of its experts' matrices where
// one fused FFN dispatch runs them (canFuseFFN: gate of every expert, up,
// down), else its gate and up matrices and its down matrices, in runs of
// ops.MaxGroup. The VRAM level then keeps each group in one arena buffer
// when it can, so that a resident layer takes one dispatch per group
// instead of one per buffer its matrices straddle.
func (g *GPUModel) groupExperts() {
	c := &g.m.Config
	for l := 0; l < c.NumHiddenLayers; l++ {
		if !c.IsMoE(l) {
			continue
		}
		var kinds [3][]tiers.Key
		for e := 0; e < c.Experts(); e++ {
			ex, ok := g.m.Expert(l, e)
			if !ok || len(ex.Tensors) != 3 {
				return
			}
			for j, name := range ex.Tensors {
				kinds[j] = append(kinds[j], g.matrixKey(name))
			}
		}
		if g.canFuseFFN() {
			// One dispatch reads all three kinds (recordFFN).
			g.cache.Group(append(append(kinds[0], kinds[1]...), kinds[2]...))
			continue
		}
		for _, run := range [][]tiers.Key{append(kinds[0], kinds[1]...), kinds[2]} {
			for i := 0; i < len(run); i += ops.MaxGroup {
				g.cache.Group(run[i:min(i+ops.MaxGroup, len(run))])
			}
		}
	}
}

// ArenaSlots is how many expert slots, in banks of perBank (a GPU
// buffer's), hold every expert matrix of m as the GPU model places them:
// a MoE layer's matrices are one bank group where they fit one bank
// (groupExperts: the fused FFN reads them in one dispatch), so a bank
// holds whole layers and the rest of it stays empty (Mixtral: 2 layers of
// 24 in a bank of 68), but for the last bank, which NewGPUArena makes only
// as large as asked. Where a layer does not fit a bank, its groups are
// of ops.MaxGroup matrices, and whole groups fill each bank the same way
// (DeepSeek-V3: 16 of 16 in a bank of 260).
func ArenaSlots(m *Manifest, perBank int) int {
	all := ExpertMatrices(m)
	if perBank <= 0 {
		return all
	}
	c := &m.Config
	moe := c.MoELayers()
	e := c.Experts()
	unit, units := 3*e, moe // groups of a whole layer
	if unit > perBank {
		// groupExperts' groups of ops.MaxGroup: a layer's gate and up
		// matrices, then its down matrices (DeepSeek-V3: 48 a layer).
		unit = ops.MaxGroup
		units = moe * ((2*e+unit-1)/unit + (e+unit-1)/unit)
	}
	per := perBank / max(unit, 1)
	if moe == 0 || e == 0 || per == 0 {
		return all + perBank
	}
	banks := (units + per - 1) / per
	last := units - (banks-1)*per // the last bank needs only its groups' slots
	return max((banks-1)*perBank+last*unit, all)
}

// holdLayer holds every matrix of every expert of MoE layer l in VRAM and
// returns the leases (gate, up, down of expert 0, then expert 1, ...), or
// nil, holding nothing, if one is not there.
func (g *GPUModel) holdLayer(l int) []*tiers.Lease {
	keys := g.layerKeys[l]
	if len(keys) == 0 {
		return nil
	}
	out := make([]*tiers.Lease, 0, len(keys))
	for _, k := range keys {
		lease := g.cache.Hold(k, tiers.VRAM)
		if lease == nil {
			releaseAll(out)
			return nil
		}
		out = append(out, lease)
	}
	return out
}

// releaseAll releases ls and returns it emptied, for reuse.
func releaseAll(ls []*tiers.Lease) []*tiers.Lease {
	for _, l := range ls {
		l.Release()
	}
	return ls[:0]
}

// chosen returns the experts of layer l that ids (the router's u32 ids)
// name; an id the manifest lacks is an error that names it.
func (g *GPUModel) chosen(l int, ids []byte) ([]*Expert, error) {
	out := make([]*Expert, 0, len(ids)/4)
	for i := 0; i+4 <= len(ids); i += 4 {
		e := int(binary.LittleEndian.Uint32(ids[i:]))
		ex, ok := g.m.Expert(l, e)
		if !ok {
			return nil, fmt.Errorf("experts: layer %d: the router chose expert %d, which the manifest lacks", l, e)
		}
		out = append(out, ex)
	}
	if g.onChoice != nil {
		idx := make([]int, len(out))
		for i, ex := range out {
			idx[i] = ex.Index
		}
		g.onChoice(l, idx)
	}
	return out, nil
}

// recordMasked records a MoE layer whose experts are all resident (layer:
// holdLayer's leases) with the router's choice (ids) left on the GPU:
// one masked dispatch per matrix kind and arena buffer.
// sel is where the router wrote its choice.
func (g *GPUModel) recordMasked(ctx context.Context, b *gpu.Batch, l int, layer []*tiers.Lease, sel gpu.Region, normed bool) {
	experts := make([]int, len(layer)/3)
	for e := range experts {
		experts[e] = e
	}
	g.recordMaskedProducts(ctx, b, l, experts, layer, sel, normed)
	g.finishLayer(ctx, b, l)
}

// recordMaskedProducts records the masked products of experts (their
// gate, up and down matrices' leases in held, three an expert, in order)
// for the router's choice in sel, up to their outputs in y: one dispatch
// per matrix kind, arena buffer and MaxGroup products, each running only
// the products of chosen experts.
func (g *GPUModel) recordMaskedProducts(ctx context.Context, b *gpu.Batch, l int, experts []int, held []*tiers.Lease, sel gpu.Region, normed bool) {
	c := &g.m.Config
	B := g.buf
	h, ffn, k := c.HiddenSize, c.ExpertFFN(), c.NumExpertsPerTok
	// products records the products of matrix kinds js (0 gate, 1 up, 2
	// down); kind 1 goes to y's upper half (gate and up share a dispatch).
	products := func(js []int, x gpu.Region, shared, xq bool, y gpu.Region, upper, rows, cols int, swiglu bool) {
		type run struct{ slots, experts []int }
		var order []*gpu.Buffer
		runs := map[*gpu.Buffer]*run{}
		for _, j := range js {
			for i, e := range experts {
				buf, idx := g.arena.Locate(held[3*i+j].Slot())
				r := runs[buf]
				if r == nil {
					r = &run{}
					runs[buf] = r
					order = append(order, buf)
				}
				id := e
				if j == 1 {
					id |= ops.MaskedUpper
				}
				r.slots, r.experts = append(r.slots, idx), append(r.experts, id)
			}
		}
		for _, buf := range order {
			r := runs[buf]
			for i := 0; i < len(r.slots); i += ops.MaxGroup {
				end := min(i+ops.MaxGroup, len(r.slots))
				if swiglu {
					g.k.Q4KMatVecMaskedSwiGLU(ctx, b, ops.Masked{Arena: buf, Slots: r.slots[i:end], Experts: r.experts[i:end], Sel: sel, K: k,
						X: x, Y: y, Rows: rows, Cols: cols}, g.upOff())
				} else {
					m := ops.Masked{Arena: buf, Slots: r.slots[i:end], Experts: r.experts[i:end], Sel: sel, K: k,
						X: x, SharedX: shared, Y: y, YUpper: upper, Rows: rows, Cols: cols, XQ: xq}
					if shared && normed {
						m.Normed = g.normed // the FFN's norm, from the accumulate before
					}
					g.k.Q4KMatVecMasked(ctx, b, m)
				}
			}
		}
	}
	if g.recordFFN(ctx, b, l, experts, held, sel, normed) {
		return
	}
	if ran, quantized := g.recordGLU(ctx, b, l, experts, held, sel, normed); ran {
		products([]int{2}, g.downX(ctx, b, 0, k, quantized), false, g.xq, B["y"], 0, h, ffn, false)
		return
	}
	upper := g.upOff()
	products([]int{0, 1}, g.ffnX(l), true, g.xq && !normed, B["gu"], upper, ffn, h, false)
	if !g.fuseSwiGLU {
		g.k.SwiGLU(ctx, b, B["gu"].Sub(0, uint64(k*ffn*4)), B["gu"].Sub(uint64(upper), uint64(k*ffn*4)), B["act"], k*ffn)
		products([]int{2}, g.downX(ctx, b, 0, k, false), false, g.xq, B["y"], 0, h, ffn, false)
	} else {
		// The down products read silu(gate) * up straight from gu.
		products([]int{2}, B["gu"], false, false, B["y"], 0, h, ffn, true)
	}
}

// recordFFN records the gate, up and down products of experts (leases
// in held, as recordMaskedProducts has them) for the router's choice in
// sel as one ops.Q4KFFN dispatch (fusedFFN), into actq and y as the
// masked dispatches write them; it records nothing and returns false
// where it cannot: fusedFFN off, the experts' x not quantized or handed
// over by a norm, their output not quantized by the gate and up
// products (gluYQ), more experts than its tables hold, a shape the
// kernel does not take, or matrices in more than one arena buffer.
func (g *GPUModel) recordFFN(ctx context.Context, b *gpu.Batch, l int, experts []int, held []*tiers.Lease, sel gpu.Region, normed bool) bool {
	c := &g.m.Config
	k := c.NumExpertsPerTok
	if !g.canFuseFFN() || normed || g.ffnCounters == nil || len(experts) == 0 {
		return false
	}
	n := len(experts)
	f := ops.FFN{Gate: make([]int, 0, n), Up: make([]int, 0, n), Down: make([]int, 0, n), Experts: experts,
		Sel: sel, K: k, X: g.ffnX(l), Q: g.actq(0, k), Y: g.buf["y"], Counters: g.ffnCounters,
		Hidden: c.HiddenSize, Width: c.ExpertFFN(), Apart: g.ffnApart}
	var arena *gpu.Buffer
	for i := range experts {
		for j, slots := range []*[]int{&f.Gate, &f.Up, &f.Down} {
			buf, idx := g.arena.Locate(held[3*i+j].Slot())
			if arena == nil {
				arena = buf
			} else if buf != arena {
				return false
			}
			*slots = append(*slots, idx)
		}
	}
	f.Arena = arena
	g.k.Q4KFFN(ctx, b, f)
	g.ffnRecorded++
	return true
}

// canFuseFFN reports whether this model's MoE layers can run their gate,
// up and down products as one dispatch (recordFFN, when their matrices
// lie in one arena buffer): fusedFFN on, the forms it computes (gate and
// up together, quantized x and output, no norm handed over), at most
// ops.MaxFFNExperts experts, a shape the kernel takes.
func (g *GPUModel) canFuseFFN() bool {
	return g.fusedFFN && g.ffnFits && g.glu && g.gluYQ() && !g.partNorm
}

// checkFFN fails if a fused FFN dispatch's workgroup gave up waiting for
// its gate and up tiles (its down rows were garbage): never, unless the
// GPU does not run a dispatch's workgroups side by side. It reads the
// counters once a generation.
func (g *GPUModel) checkFFN(ctx context.Context) error {
	if g.ffnRecorded == 0 || g.ffnCounters == nil {
		return nil
	}
	ctr := make([]uint32, ops.FFNCounterBytes/4)
	if err := g.d.Read(ctx, g.ffnCounters, gpu.Bytes(ctr)); err != nil {
		return err
	}
	if ctr[3] != 0 {
		return fmt.Errorf("experts: a fused FFN dispatch gave up waiting for its gate and up products, so its tokens are wrong; this GPU may not run a dispatch's workgroups side by side: RDRR_GPU_FFN=0 runs without it")
	}
	return nil
}

// recordGLU records the gate and up products of experts (leases in held,
// as recordMaskedProducts has them) into act, silu(gate) * up, in
// dispatches of up to MaxGroup/2 experts an arena buffer; it records
// nothing and returns false if glu is off or an expert's gate and up
// matrices lie in different arena buffers. quantized reports that the
// products wrote actq too.
func (g *GPUModel) recordGLU(ctx context.Context, b *gpu.Batch, l int, experts []int, held []*tiers.Lease, sel gpu.Region, normed bool) (ran, quantized bool) {
	if !g.glu {
		return false, false
	}
	c := &g.m.Config
	B := g.buf
	type run struct{ gates, ups, experts []int }
	var order []*gpu.Buffer
	runs := map[*gpu.Buffer]*run{}
	for i, e := range experts {
		buf, gi := g.arena.Locate(held[3*i].Slot())
		ubuf, ui := g.arena.Locate(held[3*i+1].Slot())
		if ubuf != buf {
			return false, false
		}
		r := runs[buf]
		if r == nil {
			r = &run{}
			runs[buf] = r
			order = append(order, buf)
		}
		r.gates, r.ups, r.experts = append(r.gates, gi), append(r.ups, ui), append(r.experts, e)
	}
	k := c.NumExpertsPerTok
	quantized = !normed && g.gluYQ()
	for _, buf := range order {
		r := runs[buf]
		for i := 0; i < len(r.gates); i += ops.MaxGroup / 2 {
			end := min(i+ops.MaxGroup/2, len(r.gates))
			m := ops.Masked{Arena: buf, Slots: r.gates[i:end], UpSlots: r.ups[i:end], Experts: r.experts[i:end], Sel: sel, K: k,
				X: B["xn"], SharedX: true, Y: B["act"], Rows: c.ExpertFFN(), Cols: c.HiddenSize}
			if !normed && g.xq {
				m.X, m.XQ = g.ffnX(l), true
			}
			if quantized {
				m.YQ = g.actq(0, k)
			}
			if normed {
				m.Normed = g.normed // the FFN's norm, from the accumulate before
			}
			g.k.Q4KMatVecMasked(ctx, b, m)
		}
	}
	return true, quantized
}

// Generate feeds prompt then generates up to maxTokens tokens (as
// RefModel.Generate, with the same draws), sampling on the GPU: a step
// reads back the chosen token (and the masked layers' choices), not the
// vocabulary's logits, and a prompt token before the last runs no LM
// head. Greedy tokens are the host's argmax of the same logits; top-p
// ones may differ from the float64 reference's where a draw falls within
// f32 rounding of a boundary.
func (g *GPUModel) Generate(ctx context.Context, prompt []int, maxTokens int, s Sampling, emit func(int)) ([]int, error) {
	g.clock.start() // and so the A/B's: no interval from the last generation
	var toks []int
	var err error
	if g.pipeline && !g.ProfileGPU && maxTokens > 1 && len(prompt) > 0 {
		toks, err = g.generatePipelined(ctx, prompt, maxTokens, s, emit)
	} else {
		toks, err = decode(ctx, g.m, g.Trace, prompt, maxTokens, s, emit, func(ctx context.Context, tok int, d *draw) (int, error) {
			_, next, err := g.step(ctx, tok, sampleHead(d))
			return next, err
		})
	}
	if err == nil {
		err = g.checkFFN(ctx)
	}
	return toks, err
}

// generatePipelined is Generate (decode's loop: the same tokens, draws
// and trace) with each step recorded and submitted while the GPU still
// runs the step before it: a step embeds the token the one before it
// sampled on the GPU, and the host collects that token (end) only after
// it has submitted the next step. The GPU no longer idles while the host
// records the start of a step and reads back the end of the last one.
// When the last token turns out to be the end of the text, the step
// begun after it is discarded (collected uncounted, its position given
// back).
func (g *GPUModel) generatePipelined(ctx context.Context, prompt []int, maxTokens int, s Sampling, emit func(int)) ([]int, error) {
	next := draws(s)
	n := len(prompt)
	for i, t := range prompt[:n-1] {
		g.setToken(i)
		if _, _, err := g.step(ctx, t, head{}); err != nil {
			return nil, err
		}
	}
	g.setToken(n - 1)
	run, err := g.begin(ctx, prompt[n-1], false, sampleHead(next()))
	if err != nil {
		return nil, err
	}
	defer func() { g.settling = nil }()
	var out []int
	for {
		// The step after run, recorded before run's token is known.
		var ahead *stepRun
		if len(out)+1 < maxTokens && ctx.Err() == nil {
			i := n + len(out)
			g.settling = &settling{run: run, index: i - 1, next: i}
			g.setToken(i)
			ahead, err = g.begin(ctx, -1, true, sampleHead(next()))
			g.settling = nil
			if errors.Is(err, errStopped) {
				ahead, err = nil, nil // run's token ends the text: settle ended run
			}
			if err != nil {
				// run's token is still generated, as decode would have it
				// before the step that failed.
				g.setToken(n + len(out) - 1)
				if _, tok, e := g.end(ctx, run, true); e == nil {
					out = append(out, tok)
					if emit != nil {
						emit(tok)
					}
				}
				return out, err
			}
		}
		g.setToken(n + len(out) - 1)
		settled := run.ended // settle ended it, and told the cache ahead's step began
		_, tok, err := g.end(ctx, run, true)
		if err == nil {
			err = ctx.Err() // decode stops before a token once cancelled
		}
		if err != nil {
			g.discard(ctx, ahead)
			return out, err
		}
		out = append(out, tok)
		if emit != nil {
			emit(tok)
		}
		if tk := g.m.Tokenizer; (tk != nil && tok == tk.EOS) || len(out) == maxTokens {
			g.discard(ctx, ahead)
			return out, nil
		}
		if !settled {
			// ahead did not page, so nothing settled run: ahead's step
			// begins now for the cache (its trace and its StepPolicy),
			// with the token it embeds, before what it chose is counted
			// (as settle tells it).
			g.setToken(n + len(out) - 1)
			g.cache.BeginStep(tok)
		}
		run = ahead
	}
}

// sampleHead is the head of a step that samples with d (nil: no head).
func sampleHead(d *draw) head {
	if d == nil {
		return head{}
	}
	return head{sample: true, temperature: d.temperature, topP: d.topP, u: d.u}
}

// errStopped is settle's word that the step it ended sampled the end of
// the text: the step being recorded after it is not needed.
var errStopped = errors.New("experts: the text ended")

// settling is a step that generatePipelined began and has not ended,
// while it records the next one: index is its token's place in the
// trace, next the next step's.
type settling struct {
	run         *stepRun
	index, next int
}

// settle ends the step before the one being recorded, if generatePipelined
// left one pending (g.settling), before this step pages experts: its
// masked layers' choices go into the trace and the cache's counts before
// this step's. It returns errStopped if that step sampled the end of the
// text.
func (g *GPUModel) settle(ctx context.Context) error {
	s := g.settling
	if s == nil {
		return nil
	}
	g.settling = nil
	g.setToken(s.index)
	_, tok, err := g.end(ctx, s.run, true)
	g.setToken(s.next)
	if err != nil {
		return err
	}
	if tk := g.m.Tokenizer; tk != nil && tok == tk.EOS {
		return errStopped // the step being recorded is not needed: no step begins
	}
	g.cache.BeginStep(tok) // the step being recorded embeds it
	return nil
}

// discard collects a step begun ahead that is not needed, counting
// nothing, and gives its position back.
func (g *GPUModel) discard(ctx context.Context, run *stepRun) {
	if run == nil {
		return
	}
	g.end(ctx, run, false)
	g.pos--
	g.Profile.Steps--
	g.Profile.TurnProfile = g.Profile.TurnProfile.minus(run.turns)
}

func (g *GPUModel) setToken(i int) {
	if g.Trace != nil {
		g.Trace.SetToken(i)
	}
}
