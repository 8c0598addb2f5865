package ops

import (
	"context"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// The ops whose answer is discrete: top-k routing, argmax and top-p
// sampling.

// RouteShape describes top-k routing of Tokens rows of Experts logits.
type RouteShape struct {
	Tokens, Experts, K int
	Mode               abi.RouteMode
	Groups, TopKGroup  int     // sigmoid mode: group-limited selection when Groups > 1
	Scale              float32 // sigmoid mode: routed scaling factor (0 means 1)
}

// RouteLaunch is the dispatch rule of Route; bias says whether a bias is
// bound (without one the kernel does not read that binding). Bindings:
// logits, bias, ids, weights.
func RouteLaunch(s RouteShape, bias bool) (Launch, error) {
	const name = "route"
	if s.Tokens <= 0 || s.Experts <= 0 || s.Experts > 1024 || s.K <= 0 || s.K > 32 || s.K > s.Experts {
		return Launch{}, shapeErr(name, "%+v (Experts <= 1024, K <= 32)", s)
	}
	groups, topk := 1, 1
	if s.Mode == abi.RouteSigmoidTopK && s.Groups > 1 {
		groups, topk = s.Groups, s.TopKGroup
		if groups > 64 || s.Experts%groups != 0 || topk <= 0 || topk > groups || s.K > topk*(s.Experts/groups) {
			return Launch{}, shapeErr(name, "%+v (groups <= 64 dividing Experts, K <= TopKGroup*group size)", s)
		}
	}
	scale := s.Scale
	if scale == 0 {
		scale = 1
	}
	biasBytes := uint64(0)
	if bias {
		biasBytes = uint64(s.Experts * 4)
	}
	gx, gy := uint32(min(s.Tokens, 65535)), uint32(ceilDiv(uint64(s.Tokens), 65535))
	p := gpu.Params{}.U32(uint32(s.Tokens)).U32(uint32(s.Experts)).U32(uint32(s.K)).U32(uint32(s.Mode)).
		U32(uint32(groups)).U32(uint32(topk)).F32(scale).U32(b2u(bias))
	return Launch{Kernel: name, Groups: [3]uint32{gx, gy, 1}, Params: p,
		Bindings: []Binding{{"logits", uint64(s.Tokens * s.Experts * 4)}, {"bias", biasBytes},
			{"ids", uint64(s.Tokens * s.K * 4)}, {"weights", uint64(s.Tokens * s.K * 4)}}}, nil
}

// MaxRouterExperts is the most experts RouterRoute computes the logits
// of in its own workgroup.
const MaxRouterExperts = 16

// RouterRouteLaunch is the dispatch rule of RouterRoute: route_mv, the
// router's product (an f32 matrix of s.Experts rows of cols) and Route in
// one workgroup, for one token and at most MaxRouterExperts experts.
// Bindings: logits (written), bias, ids, weights, router weights, x.
func RouterRouteLaunch(s RouteShape, cols int, bias bool) (Launch, error) {
	const name = "route_mv"
	if s.Tokens != 1 || s.Experts > MaxRouterExperts || cols <= 0 || cols%4 != 0 {
		return Launch{}, shapeErr(name, "%d tokens, %d experts, %d columns (one token, at most %d experts, columns a positive multiple of 4)", s.Tokens, s.Experts, cols, MaxRouterExperts)
	}
	return routerLaunch(name, s, cols, bias, 0)
}

// routerLaunch is the dispatch rule of route.wgsl's MV flavors, kernel
// name: Route's and the router's product (cols4, tpe and, NORM, eps).
func routerLaunch(name string, s RouteShape, cols int, bias bool, eps float32) (Launch, error) {
	l, err := RouteLaunch(s, bias)
	if err != nil {
		return Launch{}, err
	}
	pow := 1
	for pow < s.Experts {
		pow *= 2
	}
	l.Kernel = name
	// The model fixes the mode, the experts, k and the router's rows:
	// constants of the pipeline (route.wgsl).
	l.Constants = map[string]float64{"MODE": float64(s.Mode) + 1, "NEXP": float64(s.Experts), "KSEL": float64(s.K),
		"COLS4": float64(cols / 4), "TPE": float64(256 / pow)}
	l.Params = l.Params.U32(uint32(cols / 4)).U32(uint32(256 / pow)).F32(eps).U32(0)
	l.Bindings = append(l.Bindings, Binding{"router weights", uint64(s.Experts * cols * 4)}, Binding{"x", uint64(cols * 4)})
	return l, nil
}

// RouterRoute records Route of the logits rw x (rw [Experts][cols] f32, x
// [cols] f32) for one token, computed in the same dispatch; the logits
// are written too. At most MaxRouterExperts experts; bias may be nil.
func (k *Kernels) RouterRoute(ctx context.Context, b *gpu.Batch, rw, x, logits, bias, ids, weights gpu.Region, s RouteShape, cols int) error {
	l, err := RouterRouteLaunch(s, cols, bias != nil)
	if bias == nil {
		bias = x // bound but unread (logits are written)
	}
	return k.launch(ctx, b, l, err, logits, bias, ids, weights, rw, x)
}

// MaxRouterNormExperts and MaxRouterNormCols bound the experts and the
// columns (a thread a group of 16) of RouterRouteNorm.
const (
	MaxRouterNormExperts = 8
	MaxRouterNormCols    = 16 * 256
)

// RouterRouteNormLaunch is the dispatch rule of RouterRouteNorm:
// route_mv_norm, one workgroup, for one token, at most
// MaxRouterNormExperts experts, no bias, cols a multiple of 16 up to 4096
// (a thread a group of 16). Bindings: logits (written), bias (unread),
// ids, weights, router weights, x, o, norm weight.
func RouterRouteNormLaunch(s RouteShape, cols int, eps float32) (Launch, error) {
	const name = "route_mv_norm"
	if s.Tokens != 1 || s.Experts > MaxRouterNormExperts || cols <= 0 || cols%16 != 0 || cols > MaxRouterNormCols {
		return Launch{}, shapeErr(name, "%d tokens, %d experts, %d columns (one token, at most %d experts, columns a positive multiple of 16 up to %d)", s.Tokens, s.Experts, cols, MaxRouterNormExperts, MaxRouterNormCols)
	}
	l, err := routerLaunch(name, s, cols, false, eps)
	if err != nil {
		return Launch{}, err
	}
	l.Bindings = append(l.Bindings, Binding{"o", uint64(cols * 4)}, Binding{"norm weight", uint64(cols * 4)})
	return l, nil
}

// RouterRouteNorm records RouterRoute of the RMSNorm of x + o with the
// norm weight g (eps), computed in the same workgroup: each logit is the
// router's row by (x + o) * g over the root mean square of x + o, whose
// sums meet in one reduction. The router of a layer whose FFN norm
// (AccumulateRMSNormXQTo) runs beside it. Mixtral routing (no bias).
func (k *Kernels) RouterRouteNorm(ctx context.Context, b *gpu.Batch, rw, x, o, g, logits, ids, weights gpu.Region, s RouteShape, cols int, eps float32) error {
	l, err := RouterRouteNormLaunch(s, cols, eps)
	return k.launch(ctx, b, l, err, logits, x, ids, weights, rw, x, o, g)
}

// Route records top-k routing: ids ([Tokens][K] u32) and weights
// ([Tokens][K] f32) from logits ([Tokens][Experts]). bias ([Experts]) may
// be nil.
func (k *Kernels) Route(ctx context.Context, b *gpu.Batch, logits, bias, ids, weights gpu.Region, s RouteShape) error {
	l, err := RouteLaunch(s, bias != nil)
	if bias == nil {
		bias = logits // bound but unread
	}
	return k.launch(ctx, b, l, err, logits, bias, ids, weights)
}

// argmaxBlock is the values one workgroup of Argmax's first pass takes:
// 16 per thread, so that a 152k vocabulary spreads over 38 workgroups.
const argmaxBlock = 4096

// ArgmaxLaunches are the dispatch rules of Argmax over n values, and the
// scratch bytes between them. Up to a block: one workgroup (argmax_blocks
// stage 2, bindings x, out). Beyond: a workgroup per block of 4096 values
// (stage 0, bindings x, scratch), then one over the blocks' winners
// (stage 1, bindings scratch, out).
func ArgmaxLaunches(n int) ([]Launch, uint64, error) {
	if n <= 0 {
		return nil, 0, shapeErr("argmax", "%d values", n)
	}
	pass := func(groups, n, block, stage int, in, out uint64) Launch {
		return Launch{Kernel: "argmax_blocks", Groups: [3]uint32{uint32(groups), 1, 1},
			Params:   gpu.Params{}.U32(uint32(n)).U32(uint32(block)).U32(uint32(stage)).U32(0),
			Bindings: []Binding{{"x", in}, {"out", out}}}
	}
	blocks := (n + argmaxBlock - 1) / argmaxBlock
	if blocks == 1 {
		return []Launch{pass(1, n, n, 2, uint64(n*4), 4)}, 0, nil
	}
	part := uint64(blocks * 8)
	return []Launch{pass(blocks, n, argmaxBlock, 0, uint64(n*4), part), pass(1, blocks, blocks, 1, part, 4)}, part, nil
}

// Argmax records out[0] = the index (u32) of the largest of n values (the
// lowest index of it; NaNs skipped): blocks of 4096 values over many
// workgroups, then one workgroup over the blocks' winners.
func (k *Kernels) Argmax(ctx context.Context, b *gpu.Batch, x, out gpu.Region, n int) error {
	ls, part, err := ArgmaxLaunches(n)
	if err != nil {
		return b.Fail(err)
	}
	if len(ls) == 1 {
		return k.record(ctx, b, ls[0], x, out)
	}
	if err := need("argmax", "x", x, ls[0].Bindings[0].Bytes); err != nil {
		return b.Fail(err)
	}
	if err := need("argmax", "out", out, 4); err != nil {
		return b.Fail(err)
	}
	scratch, err := b.Scratch(part)
	if err != nil {
		return err
	}
	if err := k.record(ctx, b, ls[0], x, scratch); err != nil {
		return err
	}
	return k.record(ctx, b, ls[1], scratch, out)
}

// TopPShape is one top-p draw over N logits: the nucleus of
// softmax(logits/Temperature) up to mass TopP, sampled with the uniform
// draw U in [0, 1) (see ref.TopP for the exact rule).
type TopPShape struct {
	N                 int
	Temperature, TopP float32
	U                 float32
}

// check validates a draw (Temperature > 0).
func (s TopPShape) check() error {
	if s.N <= 0 || s.N > 1<<28 || s.Temperature <= 0 || s.TopP <= 0 || s.TopP > 1 || s.U < 0 || s.U >= 1 {
		return shapeErr("topp", "n %d, temperature %v, top-p %v, u %v (want 0 < n <= 2^28, temperature > 0, 0 < top-p <= 1, 0 <= u < 1)", s.N, s.Temperature, s.TopP, s.U)
	}
	return nil
}

// toppBlock is the values one workgroup of TopP takes (a multiple of
// 256): a 152k vocabulary spreads over 75, eight values a thread. A stage's
// time is its per-value instruction chain times the values a thread takes
// (gpu/BENCHMARKS.md): blocks of 2048 took 28.4-29.0 us on the H100 where
// blocks of 4096 took 33.6-35.1.
const toppBlock = 2048

// toppMaxBlocks is the most workgroups TopP spreads over: past 128 blocks
// of toppBlock values (a 262144 vocabulary) the blocks widen instead, so
// that the blocks' round-2 suffix sums (4 KiB each, see the kernel) stay
// a few hundred KiB of scratch.
const toppMaxBlocks = 128

// toppStages is the dispatches of topp_blocks (see the kernel).
const toppStages = 5

// toppBlocks returns the values a block of TopP over n values takes and
// the number of blocks.
func toppBlocks(n int) (block, nb int) {
	block = toppBlock
	if nb = (n + block - 1) / block; nb > toppMaxBlocks {
		per := (n + toppMaxBlocks - 1) / toppMaxBlocks
		block = (per + toppBlock - 1) / toppBlock * toppBlock
		nb = (n + block - 1) / block
	}
	return block, nb
}

// TopPLaunches are the dispatch rules of TopP for Temperature > 0: the five
// stages of topp_blocks, each with bindings logits, scratch, out; and the
// scratch bytes.
func TopPLaunches(s TopPShape) ([]Launch, uint64, error) {
	if err := s.check(); err != nil {
		return nil, 0, err
	}
	block, nb := toppBlocks(s.N)
	scratch := toppScratch(nb)
	ls := make([]Launch, toppStages)
	for stage := range ls {
		groups := uint32(nb)
		if stage == toppStages-1 {
			groups = 1
		}
		ls[stage] = Launch{Kernel: "topp_blocks", Groups: [3]uint32{groups, 1, 1},
			Params: gpu.Params{}.U32(uint32(s.N)).F32(1 / s.Temperature).F32(s.TopP).F32(s.U).
				U32(uint32(stage)).U32(uint32(block)).U32(uint32(nb)).U32(0),
			Bindings: []Binding{{"logits", uint64(s.N * 4)}, {"scratch", scratch}, {"out", 4}}}
	}
	return ls, scratch, nil
}

// toppScratch is the scratch bytes of TopP over nb blocks: three rounds'
// 1024-bucket histograms, the select's state, then three words and 1024
// suffix sums a block.
func toppScratch(nb int) uint64 { return uint64(3088+(3+1024)*nb) * 4 }

// TopP records out[0] = a token sampled as s says (five dispatches over a
// workgroup per block of values, topp_blocks). Temperature <= 0 means
// greedy (Argmax).
func (k *Kernels) TopP(ctx context.Context, b *gpu.Batch, logits, out gpu.Region, s TopPShape) error {
	if s.Temperature <= 0 {
		return k.Argmax(ctx, b, logits, out, s.N)
	}
	ls, scratch, err := TopPLaunches(s)
	if err != nil {
		return b.Fail(err)
	}
	if err := need("topp", "logits", logits, ls[0].Bindings[0].Bytes); err != nil {
		return b.Fail(err)
	}
	if err := need("topp", "out", out, 4); err != nil {
		return b.Fail(err)
	}
	sb, err := b.Scratch(scratch)
	if err != nil {
		return err
	}
	for _, l := range ls {
		if err := k.record(ctx, b, l, logits, sb, out); err != nil {
			return err
		}
	}
	return nil
}
