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

// ArgmaxLaunch is the dispatch rule of the one-workgroup argmax kernel
// (argmax), the kernel lab's baseline of the op; Kernels.Argmax runs
// argmax_blocks. Bindings: x, out.
func ArgmaxLaunch(n int) (Launch, error) {
	if n <= 0 {
		return Launch{}, shapeErr("argmax", "%d values", n)
	}
	return Launch{Kernel: "argmax", Groups: [3]uint32{1, 1, 1}, Params: gpu.Params{}.U32(uint32(n)),
		Bindings: []Binding{{"x", uint64(n * 4)}, {"out", 4}}}, nil
}

// Argmax records out[0] = the index (u32) of the largest of n values (the
// lowest index of it; NaNs skipped): blocks of 4096 values over many
// workgroups, then one workgroup over the blocks' winners.
func (k *Kernels) Argmax(ctx context.Context, b *gpu.Batch, x, out gpu.Region, n int) error {
	const name = "argmax"
	if n <= 0 {
		return b.Fail(shapeErr(name, "%d values", n))
	}
	if err := need(name, "x", x, uint64(n*4)); err != nil {
		return b.Fail(err)
	}
	if err := need(name, "out", out, 4); err != nil {
		return b.Fail(err)
	}
	blocks := (n + argmaxBlock - 1) / argmaxBlock
	pass := func(groups, n, block, mode int, out uint64) Launch {
		return Launch{Kernel: "argmax_blocks", Groups: [3]uint32{uint32(groups), 1, 1},
			Params:   gpu.Params{}.U32(uint32(n)).U32(uint32(block)).U32(uint32(mode)).U32(0),
			Bindings: []Binding{{"x", uint64(n) * uint64(4+4*(mode&1))}, {"out", out}}}
	}
	if blocks == 1 {
		return k.record(ctx, b, pass(1, n, n, 2, 4), x, out)
	}
	part, err := b.Scratch(uint64(blocks * 8))
	if err != nil {
		return err
	}
	if err := k.record(ctx, b, pass(blocks, n, argmaxBlock, 0, uint64(blocks*8)), x, part); err != nil {
		return err
	}
	return k.record(ctx, b, pass(1, blocks, blocks, 1, 4), part, out)
}

// TopPShape is one top-p draw over N logits: the nucleus of
// softmax(logits/Temperature) up to mass TopP, sampled with the uniform
// draw U in [0, 1) (see ref.TopP for the exact rule).
type TopPShape struct {
	N                 int
	Temperature, TopP float32
	U                 float32
}

// TopPLaunch is the dispatch rule of TopP for Temperature > 0. Bindings:
// logits, out.
func TopPLaunch(s TopPShape) (Launch, error) {
	const name = "topp"
	if s.N <= 0 || s.Temperature <= 0 || s.TopP <= 0 || s.TopP > 1 || s.U < 0 || s.U >= 1 {
		return Launch{}, shapeErr(name, "n %d, temperature %v, top-p %v, u %v (want temperature > 0, 0 < top-p <= 1, 0 <= u < 1)", s.N, s.Temperature, s.TopP, s.U)
	}
	return Launch{Kernel: name, Groups: [3]uint32{1, 1, 1},
		Params:   gpu.Params{}.U32(uint32(s.N)).F32(1 / s.Temperature).F32(s.TopP).F32(s.U),
		Bindings: []Binding{{"logits", uint64(s.N * 4)}, {"out", 4}}}, nil
}

// toppBlock is the values one workgroup of TopP's multi-workgroup passes
// takes (a multiple of 256): a 152k vocabulary spreads over 38.
const toppBlock = 4096

// toppStages is the dispatches of topp_blocks (see the kernel).
const toppStages = 6

// TopPBlocksLaunch is the dispatch rule of stage (0 to 5) of TopP over
// more than one block of values. Bindings: logits, scratch (ToppScratch
// bytes), out.
func TopPBlocksLaunch(s TopPShape, stage int) (Launch, error) {
	const name = "topp_blocks"
	if _, err := TopPLaunch(s); err != nil {
		return Launch{}, err
	}
	if stage < 0 || stage >= toppStages || s.N > 1<<28 {
		return Launch{}, shapeErr(name, "stage %d of %d values (stages 0-%d, at most 2^28 values)", stage, s.N, toppStages-1)
	}
	nb := (s.N + toppBlock - 1) / toppBlock
	groups := uint32(nb)
	if stage == toppStages-1 {
		groups = 1
	}
	return Launch{Kernel: name, Groups: [3]uint32{groups, 1, 1},
		Params: gpu.Params{}.U32(uint32(s.N)).F32(1 / s.Temperature).F32(s.TopP).F32(s.U).
			U32(uint32(stage)).U32(toppBlock).U32(uint32(nb)).U32(0),
		Bindings: []Binding{{"logits", uint64(s.N * 4)}, {"scratch", toppScratch(nb)}, {"out", 4}}}, nil
}

// toppScratch is the scratch bytes of TopP over nb blocks: three rounds'
// 1024-bucket histograms, the select's state, then four words a block.
func toppScratch(nb int) uint64 { return uint64(3088+4*nb) * 4 }

// TopP records out[0] = a token sampled as s says. Temperature <= 0 means
// greedy (Argmax). Up to one block of values it is one workgroup (topp);
// beyond, six dispatches over a workgroup per block (topp_blocks),
// with the same rule.
func (k *Kernels) TopP(ctx context.Context, b *gpu.Batch, logits, out gpu.Region, s TopPShape) error {
	if s.Temperature <= 0 {
		return k.Argmax(ctx, b, logits, out, s.N)
	}
	l, err := TopPLaunch(s)
	if err != nil || s.N <= toppBlock {
		return k.launch(ctx, b, l, err, logits, out)
	}
	scratch, err := b.Scratch(toppScratch((s.N + toppBlock - 1) / toppBlock))
	if err != nil {
		return err
	}
	for stage := range toppStages {
		l, err := TopPBlocksLaunch(s, stage)
		if err := k.launch(ctx, b, l, err, logits, scratch, out); err != nil {
			return err
		}
	}
	return nil
}
