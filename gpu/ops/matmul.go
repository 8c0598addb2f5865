package ops

import (
	"context"
	"math"
	"slices"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// The matrix ops: Q4_K products (one token, several, a group of
// matrices in one dispatch, the MoE layer's masked products), dense f32
// and f16 products, Q4_K dequantization.

// MatShape is a product's shape: y[t] = W x[t] for Tokens tokens, W
// Rows x Cols (row-major), x [Tokens][Cols] f32, y [Tokens][Rows] f32.
type MatShape struct {
	Rows, Cols, Tokens int
}

// tokTile is the tokens one workgroup of a product of n tokens takes.
func tokTile(n int) int {
	switch {
	case n <= 1:
		return 1
	case n == 2:
		return 2
	case n <= 4:
		return 4
	}
	return 8
}

// Q4KConfig chooses how the Q4_K product kernel spreads a shape: SPR block
// slots per row group (power of two <= 32) and Rows rows per thread. Convert
// selects the nibble-to-float conversion: false uses the exact 2^23 trick
// (fast everywhere), true the plain integer conversion (kept for the kernel
// lab's comparisons).
type Q4KConfig struct {
	SPR, Rows int
	Convert   bool
	// Coalesced selects q4k_matvec_co for one token: threads read quant
	// words so that x is read in whole lines.
	Coalesced bool
	// Pipeline issues the next block's loads before the current block's
	// arithmetic (one token).
	Pipeline bool
	// Shifts extracts nibbles with one shift each instead of the
	// positional trick (fewer registers, more instructions).
	Shifts bool
	// WG is the workgroup size: 64, 128 or 256 (0 means 256).
	WG int
}

// DefaultQ4KConfig is the shape policy the wrappers use, tuned on an H100
// (see gpu/BENCHMARKS.md) for what a decode step runs: one product after
// another, each waiting for the previous one, so that a product must fill
// the GPU on its own. Long rows (16 blocks and more): 4 rows per thread (8
// from 32 blocks, where each thread walks many blocks and x is read once
// for 8 rows), software pipelining, and block slots doubled until the
// product has about 48k threads (H100, BenchmarkQ4KDecode's sweep of 60
// configurations per shape: qkv 6144x4096 23.5 -> 13.4 us, o 4096x4096
// 15.7 -> 10.9, masked gate and up 85 -> 77, masked down 67 -> 49 against
// the earlier policy, which was tuned on products that overlap). Short rows
// in bulk (a group of expert products, at most 8 blocks): one block slot,
// 8 rows per thread. Tiny matrices, few rows and small batches (n > 1): the
// simple layout.
func DefaultQ4KConfig(rows, cols, n int) Q4KConfig {
	nb := cols / 256
	switch {
	case n > 1 || rows < 256 || rows*cols < 1<<20:
		return Q4KConfig{SPR: int(min(32, floorPow2(uint64(nb)))), Rows: 2}
	case nb <= 8:
		// Short rows in bulk (a group of expert down projections,
		// 2048 columns): one block slot, each thread walks the whole
		// row for 8 rows (H100, 8 x 7168x2048: 0.73x of copy against
		// 0.39-0.64x for 2-8 slots).
		return Q4KConfig{WG: 128, SPR: 1, Rows: 8, Pipeline: true}
	}
	const wg, threads = 128, 48 << 10
	r := 4
	if nb >= 32 {
		r = 8
	}
	spr := 1
	for spr < wg/8 && 2*spr <= nb && rows*8*spr/r < threads {
		spr *= 2
	}
	return Q4KConfig{WG: wg, SPR: spr, Rows: r, Pipeline: true}
}

func (cfg Q4KConfig) wg() int {
	if cfg.WG == 0 {
		return 256
	}
	return cfg.WG
}

// rowsPerWG is the rows one workgroup of cfg takes.
func (cfg Q4KConfig) rowsPerWG() uint64 { return uint64(cfg.Rows * cfg.wg() / 8 / cfg.SPR) }

func checkQ4KConfig(name string, cfg Q4KConfig) error {
	wg := cfg.wg()
	if cfg.SPR <= 0 || cfg.SPR > wg/8 || cfg.SPR&(cfg.SPR-1) != 0 || cfg.Rows <= 0 || cfg.Rows > 16 || cfg.Rows*wg > 4096 || (wg != 64 && wg != 128 && wg != 256) {
		return shapeErr(name, "config %+v (WG 64, 128 or 256; SPR a power of two <= WG/8; Rows 1..16, Rows*WG <= 4096)", cfg)
	}
	return nil
}

// q4kConsts are q4k_matmul.wgsl's override constants for cfg and tok
// tokens per workgroup.
func q4kConsts(cfg Q4KConfig, tok int) map[string]float64 {
	return map[string]float64{"ROWS": float64(cfg.Rows), "TOK": float64(tok), "CONV": b2f(!cfg.Convert),
		"PIPE": b2f(cfg.Pipeline), "POS": b2f(!cfg.Shifts), "WG": float64(cfg.wg())}
}

// Q4KLaunch is the dispatch rule of the Q4_K product y[t] = W x[t] (W
// Q4_K rows) with configuration cfg: q4k_matmul with the constants ROWS,
// TOK, CONV, PIPE, POS, WG (and ACC = 1 when add: y += W x, one token),
// or q4k_matvec_co when cfg.Coalesced picks it for one token. Bindings:
// weights, x, y. Cols must be a positive multiple of 256.
func Q4KLaunch(cfg Q4KConfig, s MatShape, add bool) (Launch, error) {
	const name = "q4k_matmul"
	rows, cols, n := s.Rows, s.Cols, s.Tokens
	if rows <= 0 || cols <= 0 || n <= 0 || cols%256 != 0 || (add && n != 1) {
		return Launch{}, shapeErr(name, "rows %d, cols %d, tokens %d (cols must be a positive multiple of 256)", rows, cols, n)
	}
	if add {
		cfg.Coalesced = false // the q4k_matvec_co kernel only stores
	}
	if err := checkQ4KConfig(name, cfg); err != nil {
		return Launch{}, err
	}
	binds := []Binding{{"weights", abi.Q4K.Bytes(rows * cols)}, {"x", uint64(n * cols * 4)}, {"y", uint64(n * rows * 4)}}
	tok := tokTile(n)
	gx, gy := grid(ceilDiv(uint64(rows), cfg.rowsPerWG()))
	gz := ceilDiv(uint64(n), uint64(tok))
	if gz > 65535 {
		return Launch{}, shapeErr(name, "%d tokens is too many", n)
	}
	if cfg.Coalesced && n == 1 && cfg.wg() == 256 {
		return Launch{Kernel: "q4k_matvec_co", Constants: map[string]float64{"ROWS": float64(cfg.Rows)}, Groups: [3]uint32{gx, gy, 1},
			Params: gpu.Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(1).U32(gx), Bindings: binds}, nil
	}
	consts := q4kConsts(cfg, tok)
	if add {
		consts["ACC"] = 1
	}
	return Launch{Kernel: name, Constants: consts, Groups: [3]uint32{gx, gy, uint32(gz)},
		Params: gpu.Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(uint32(n)).U32(gx), Bindings: binds}, nil
}

// Q4KMatVec records y = W x for W (rows x cols, Q4_K rows), x (cols f32),
// y (rows f32). cols must be a multiple of 256.
func (k *Kernels) Q4KMatVec(ctx context.Context, b *gpu.Batch, w, x, y gpu.Region, rows, cols int) error {
	return k.Q4KMatMul(ctx, b, w, x, y, MatShape{Rows: rows, Cols: cols, Tokens: 1})
}

// Q4KMatMul records y[t] = W x[t] for s.Tokens tokens.
func (k *Kernels) Q4KMatMul(ctx context.Context, b *gpu.Batch, w, x, y gpu.Region, s MatShape) error {
	return k.Q4KMatMulWith(ctx, b, DefaultQ4KConfig(s.Rows, s.Cols, s.Tokens), w, x, y, s)
}

// Q4KMatMulWith is Q4KMatMul with an explicit configuration (benchmarks and
// the kernel lab sweep it).
func (k *Kernels) Q4KMatMulWith(ctx context.Context, b *gpu.Batch, cfg Q4KConfig, w, x, y gpu.Region, s MatShape) error {
	l, err := Q4KLaunch(cfg, s, false)
	return k.launch(ctx, b, l, err, w, x, y)
}

// Q4KXQLaunch is the dispatch rule of Q4KMatVecXQWith: q4k_matmul_xq,
// Q4KLaunch's one-token rule for x in QuantizeX's form. Bindings:
// weights, x (XQBytes(cols)), y.
func Q4KXQLaunch(cfg Q4KConfig, rows, cols int) (Launch, error) {
	cfg.Coalesced = false // q4k_matvec_co reads float x
	l, err := Q4KLaunch(cfg, MatShape{Rows: rows, Cols: cols, Tokens: 1}, false)
	if err != nil {
		return Launch{}, err
	}
	l.Kernel = "q4k_matmul_xq"
	l.Bindings[1] = Binding{"x", XQBytes(cols)}
	return l, nil
}

// Q4KMatVecXQ records y = W x for x quantized (QuantizeX, RMSNormXQ,
// AttentionXQ): two weights a 32-bit integer multiply-add.
func (k *Kernels) Q4KMatVecXQ(ctx context.Context, b *gpu.Batch, w, x, y gpu.Region, rows, cols int) error {
	return k.Q4KMatVecXQWith(ctx, b, DefaultQ4KConfig(rows, cols, 1), w, x, y, rows, cols)
}

// Q4KMatVecXQWith is Q4KMatVecXQ with an explicit configuration.
func (k *Kernels) Q4KMatVecXQWith(ctx context.Context, b *gpu.Batch, cfg Q4KConfig, w, x, y gpu.Region, rows, cols int) error {
	l, err := Q4KXQLaunch(cfg, rows, cols)
	return k.launch(ctx, b, l, err, w, x, y)
}

// Normed is an RMSNorm's output handed from the dispatch that wrote the
// norm's input (AccumulateNorm) to the products that read it, with no
// dispatch of its own: XG holds x * g (g the norm's weight) and Parts the
// AccumParts(len(x)) partial sums of x^2. A product of XG whose rows are
// scaled by 1 / sqrt(sum(Parts) / len(x) + Eps) is the product of the
// norm's output.
type Normed struct {
	XG, Parts gpu.Region
	Eps       float32
}

// MaxParts bounds the partial sums of a Normed (len(x) <= 256 MaxParts):
// the products sum at most this many (the WGSL's min(p.nparts, 64u)).
const MaxParts = 64

// checkParts refuses a norm handed over for a vector of cols that has
// more partial sums than the products sum.
func checkParts(kernel string, cols int) error {
	if AccumParts(cols) > MaxParts {
		return shapeErr(kernel, "a norm of %d values (at most %d)", cols, 256*MaxParts)
	}
	return nil
}

// Q4KMatVecNormed records y = W RMSNorm(x) from n (see Normed): the
// norm's dispatch gone, its work a scale per row.
func (k *Kernels) Q4KMatVecNormed(ctx context.Context, b *gpu.Batch, w gpu.Region, n Normed, y gpu.Region, rows, cols int) error {
	l, err := Q4KPartLaunch(DefaultQ4KConfig(rows, cols, 1), rows, cols, n)
	return k.launch(ctx, b, l, err, w, n.XG, y, n.Parts)
}

// Q4KPartLaunch is the dispatch rule of Q4KMatVecNormed with
// configuration cfg (the matrix-vector path of q4k_matmul, never
// q4k_matvec_co): q4k_matmul_part. Bindings: weights, x * g, y, partial
// sums.
func Q4KPartLaunch(cfg Q4KConfig, rows, cols int, n Normed) (Launch, error) {
	const name = "q4k_matmul_part"
	if err := checkParts(name, cols); err != nil {
		return Launch{}, err
	}
	cfg.Coalesced = false
	l, err := Q4KLaunch(cfg, MatShape{Rows: rows, Cols: cols, Tokens: 1}, false)
	if err != nil {
		return Launch{}, err
	}
	l.Kernel = name
	l.Params = normParams(l.Params, 96, n.Eps, cols)
	l.Bindings = append(l.Bindings, Binding{"partial sums", uint64(AccumParts(cols) * 4)})
	return l, nil
}

// normParams appends the PART flavors' fields to p at byte at (the end
// of the plain or masked Params): eps, the partial sums of a vector of
// cols and padding.
func normParams(p gpu.Params, at int, eps float32, cols int) gpu.Params {
	for len(p) < at {
		p = p.U32(0)
	}
	return p.F32(eps).U32(uint32(AccumParts(cols))).U32(0).U32(0)
}

// Q4KMatVecAdd records y += W x (a product added into a residual stream,
// one dispatch instead of a product and an Accumulate).
func (k *Kernels) Q4KMatVecAdd(ctx context.Context, b *gpu.Batch, w, x, y gpu.Region, rows, cols int) error {
	l, err := Q4KLaunch(DefaultQ4KConfig(rows, cols, 1), MatShape{Rows: rows, Cols: cols, Tokens: 1}, true)
	return k.launch(ctx, b, l, err, w, x, y)
}

// MaxGroup is the most products one Q4KMatVecGroup dispatch runs.
const MaxGroup = 16

// Group is len(Slots) independent Q4_K products in one dispatch: y[e] =
// W[Slots[e]] x[e] for e < len(Slots) <= MaxGroup, where Arena holds
// equal slots of Rows x Cols Q4_K matrices (slot s at byte s *
// abi.Q4K.Bytes(Rows*Cols)), X holds one Cols-vector per product (or one
// for all if SharedX), and Y receives the products' rows one after
// another. This is how an MoE layer's expert products run: one launch for
// all of them, the weights wherever the expert cache put them.
type Group struct {
	Arena      gpu.Region
	Slots      []int
	X          gpu.Region
	SharedX    bool
	Y          gpu.Region
	Rows, Cols int
	// UpSlots, if not nil, makes product e an expert's gate (at Slots[e])
	// and up (at UpSlots[e]) matrices together, writing silu(gate) * up
	// into Y (q4k_matmul_glu, as Masked.UpSlots): at most MaxGroup/2
	// products.
	UpSlots []int
	// XQ, if set, makes X quantized (QuantizeX's form, XQBytes(Cols) a
	// vector) and the products integer multiply-adds of two weights at a
	// time (the _xq kernels).
	XQ bool
	// YQ, if not nil (with UpSlots and XQ), also gets Y quantized
	// (QuantizeX's form): the down products' x without a QuantizeX
	// dispatch. GLUQuantizesY says which shapes can.
	YQ gpu.Region
	// K, if not zero, is how many products the configuration is chosen
	// for (an MoE layer's chosen experts), instead of len(Slots): every
	// dispatch of one Rows, Cols, XQ and K, and every Masked of that K,
	// sums a row in the same order, so that an expert's product has the
	// same bits whether it runs alone, in a group or masked.
	K int
}

// Q4KMatVecGroup records g with the configuration groupConfig picks for
// its rows (g.K products of them, or len(g.Slots)).
func (k *Kernels) Q4KMatVecGroup(ctx context.Context, b *gpu.Batch, g Group) error {
	n := g.K
	if n <= 0 {
		n = len(g.Slots)
	}
	return k.Q4KMatVecGroupWith(ctx, b, groupConfig(g.Rows*n, g.Cols, g.XQ), g)
}

// Q4KMatVecGroupWith is Q4KMatVecGroup with an explicit configuration.
func (k *Kernels) Q4KMatVecGroupWith(ctx context.Context, b *gpu.Batch, cfg Q4KConfig, g Group) error {
	l, err := GroupLaunch(cfg, g)
	if g.YQ != nil {
		return k.launch(ctx, b, l, err, g.Arena, g.X, g.Y, g.YQ)
	}
	return k.launch(ctx, b, l, err, g.Arena, g.X, g.Y)
}

// GroupLaunch is the dispatch rule of Q4KMatVecGroupWith (it reads g's
// shape, not its regions): q4k_matmul with GROUPED = 1. Bindings: weight
// arena, x, y.
func GroupLaunch(cfg Q4KConfig, g Group) (Launch, error) {
	return groupLaunch(cfg, groupCall{slots: g.Slots, upSlots: g.UpSlots, sharedX: g.SharedX, xUpper: -1, rows: g.Rows, cols: g.Cols, xq: g.XQ, yq: g.YQ != nil})
}

// Masked is an MoE layer's expert products with the router's choice left
// on the GPU (Q4KMatVecMasked): product e is expert Experts[e], its
// matrix in Arena slot Slots[e] (equal slots of Rows x Cols Q4_K
// matrices), and Sel holds the K expert ids the router chose (u32, as
// Route writes them).
type Masked struct {
	Arena   gpu.Region
	Slots   []int
	Experts []int // an entry with MaskedUpper set writes YUpper bytes further into Y
	Sel     gpu.Region
	K       int
	X       gpu.Region // K cols-vectors, or one for all if SharedX
	SharedX bool
	Y       gpu.Region
	YUpper  int // a multiple of 4
	Rows    int
	Cols    int
	// Normed, if set (its Parts not nil), is an RMSNorm's output that the
	// products read instead of X (shared): q4k_matmul_masked_part, the
	// norm's dispatch gone (see Normed).
	Normed Normed
	// UpSlots, if not nil, makes each product an expert's gate (at Slots[e])
	// and up (at UpSlots[e]) matrices together, writing silu(gate) * up
	// (q4k_matmul_masked_glu): Y gets K rows vectors of SwiGLU's output,
	// no Experts entry has MaskedUpper, and at most MaxGroup/2 experts.
	UpSlots []int
	// XQ, if set, makes X quantized (as Group.XQ); not with Normed.
	XQ bool
	// YQ: as Group.YQ.
	YQ gpu.Region
}

func (m Masked) call() groupCall {
	return groupCall{slots: m.Slots, upSlots: m.UpSlots, experts: m.Experts, kSel: m.K,
		sharedX: m.SharedX, xUpper: -1, yUpper: m.YUpper, rows: m.Rows, cols: m.Cols, normed: m.Normed, xq: m.XQ, yq: m.YQ != nil}
}

// binds are m's regions in the order of its kernel's bindings.
func (m Masked) binds() []gpu.Region {
	if m.Normed.Parts != nil {
		return []gpu.Region{m.Arena, m.Normed.XG, m.Y, m.Sel, m.Normed.Parts}
	}
	if m.YQ != nil {
		return []gpu.Region{m.Arena, m.X, m.Y, m.Sel, m.YQ}
	}
	return []gpu.Region{m.Arena, m.X, m.Y, m.Sel}
}

// Q4KMatVecMasked records m. If Experts[e] is Sel[j], product e reads
// X[j] (or the one shared X) and writes Y's rows j*Rows..; if the router
// did not choose it, it does nothing. Every expert the router can choose
// must therefore be a product of one of the calls that fill Y (several
// calls when a layer's experts lie in several arena buffers); what the
// caller knows is that all of the layer's experts are resident, not which
// ones run, so there is no read-back between routing and the experts.
//
// An Experts entry with MaskedUpper set writes its output YUpper bytes
// further into Y: an expert's up matrix can run in the same dispatch as
// its gate, each filling its half of Y.
func (k *Kernels) Q4KMatVecMasked(ctx context.Context, b *gpu.Batch, m Masked) error {
	l, err := maskedLaunch(m.call())
	return k.launch(ctx, b, l, err, m.binds()...)
}

// Q4KMatVecMaskedSwiGLU is Q4KMatVecMasked for an MoE layer's down
// products straight from its gate and up products: product j's x is
// silu(gate[j]) * up[j], gate rows of Cols floats from m.X's start, up
// rows from byte upOff (a multiple of 16); m.SharedX and m.YUpper are
// not used. It saves the SwiGLU dispatch.
func (k *Kernels) Q4KMatVecMaskedSwiGLU(ctx context.Context, b *gpu.Batch, m Masked, upOff int) error {
	if upOff < m.K*m.Cols*4 || upOff%16 != 0 {
		return b.Fail(shapeErr("q4k_matmul_masked", "up half at byte %d of %d gate rows of %d", upOff, m.K, m.Cols))
	}
	if err := need("q4k_matmul_masked", "gate and up", m.X, uint64(upOff+m.K*m.Cols*4)); err != nil {
		return b.Fail(err)
	}
	g := m.call()
	g.sharedX, g.xUpper, g.yUpper = false, upOff, 0
	l, err := maskedLaunch(g)
	return k.launch(ctx, b, l, err, m.binds()...)
}

func maskedLaunch(g groupCall) (Launch, error) {
	if len(g.experts) != len(g.slots) || g.kSel <= 0 || g.kSel > 32 || g.yUpper < 0 || g.yUpper%4 != 0 {
		return Launch{}, shapeErr("q4k_matmul_masked", "%d experts for %d slots, %d chosen (1..32), upper half at byte %d", len(g.experts), len(g.slots), g.kSel, g.yUpper)
	}
	// Chosen for the K products the router chooses, however many of the
	// layer's experts this dispatch holds: the rows' sums are then those
	// of a Group of that K (Group.K).
	return groupLaunch(groupConfig(g.rows*g.kSel, g.cols, g.xq), g)
}

// groupCall is the shape of one Q4KMatVecGroup or Q4KMatVecMasked
// dispatch: the products (weights at arena slots; experts and kSel when
// masked), their input (xUpper >= 0, masked only: x is SwiGLU of gate
// rows and up rows xUpper bytes further) and their output (yUpper: the
// upper half).
type groupCall struct {
	slots, experts []int
	upSlots        []int // GLU: the up matrices' slots (see Masked.UpSlots)
	kSel           int
	sharedX        bool
	xUpper         int
	yUpper         int
	rows, cols     int
	normed         Normed // masked only: if its Parts are set, x (shared) is an RMSNorm's output
	xq             bool   // x quantized (QuantizeX): the _xq kernels
	yq             bool   // GLU's output quantized too: the _yq kernels
}

// GLUQuantizesY reports whether gate and up products of rows x cols
// matrices, k of them chosen (masked) or in the group, can hand their
// output over quantized (Group.YQ, Masked.YQ) with the default
// configuration: each workgroup's output rows must be whole groups of
// XQGroup.
func GLUQuantizesY(rows, cols, k int) bool {
	return gluYQ(groupConfig(rows*k, cols, true), rows)
}

// groupConfig is DefaultQ4KConfig for a group's or a masked dispatch's
// products, rows of them in all, except for products of quantized x (xq)
// of long rows (16 blocks and more) where it gives one block slot: 2 block
// slots and 8 rows a thread (GLU: 4 of gate, 4 of up). On an H200
// (BenchmarkQ4KDecode with RDRR_BENCH_SWEEP=1, gpu/BENCHMARKS.md,
// 2026-11-28, evening) the masked Mixtral-shaped gate and up took 47.1
// us so against 52.9 with the float kernel's choice (1 slot, 4 rows),
// whose arithmetic the quantized x has made lighter. A row's sum depends
// only on the block slots (the order of its blocks and of the tree that
// adds the slots' parts), so gate and up products run apart (their
// matrices in different arena buffers) sum as the GLU ones do.
func groupConfig(rows, cols int, xq bool) Q4KConfig {
	cfg := DefaultQ4KConfig(rows, cols, 1)
	if xq && cfg.Pipeline && cfg.SPR == 1 && cols/256 >= 16 {
		cfg.SPR, cfg.Rows = 2, 8
	}
	return cfg
}

func gluYQ(cfg Q4KConfig, rows int) bool {
	return rows%XQGroup == 0 && cfg.Rows%2 == 0 && (cfg.rowsPerWG()/2)%XQGroup == 0
}

// MaskedUpper marks a Q4KMatVecMasked product whose output goes to the
// upper half of y.
const MaskedUpper = 1 << 31

// groupLaunch is the rule of Q4KMatVecGroupWith, or of Q4KMatVecMasked
// when g.experts is not nil (q4k_matmul_masked, binding sel after y).
func groupLaunch(cfg Q4KConfig, g groupCall) (Launch, error) {
	slots, experts, kSel, sharedX, xUpper, yUpper, rows, cols :=
		g.slots, g.experts, g.kSel, g.sharedX, g.xUpper, g.yUpper, g.rows, g.cols
	name := "q4k_matmul"
	outs := len(slots) // products whose output y holds
	if experts != nil {
		name, outs = "q4k_matmul_masked", kSel
		if g.normed.Parts != nil {
			name = "q4k_matmul_masked_part"
			if !sharedX || xUpper >= 0 {
				return Launch{}, shapeErr(name, "a norm's output is one shared x (not SwiGLU's gate and up)")
			}
			if err := checkParts(name, cols); err != nil {
				return Launch{}, err
			}
		}
	}
	glu := g.upSlots != nil
	if glu {
		name += "_glu"
	}
	if g.xq {
		name += "_xq"
		if xUpper >= 0 || g.normed.Parts != nil {
			return Launch{}, shapeErr(name, "quantized x is not SwiGLU's gate and up or a norm's handed-over output")
		}
	}
	if g.yq {
		name += "_yq"
		if !glu || !g.xq || !gluYQ(cfg, rows) {
			return Launch{}, shapeErr(name, "quantized output: gate and up of quantized x, %d rows in whole groups of %d a workgroup (%d a workgroup)", rows, XQGroup, cfg.rowsPerWG()/2)
		}
	}
	if rows <= 0 || cols <= 0 || cols%256 != 0 || len(slots) == 0 || len(slots) > MaxGroup {
		return Launch{}, shapeErr(name, "group of %d products of %dx%d (1..%d products; cols a positive multiple of 256)", len(slots), rows, cols, MaxGroup)
	}
	if glu && (len(g.upSlots) != len(slots) || len(slots) > MaxGroup/2 || xUpper >= 0 || yUpper != 0 || cfg.Rows%2 != 0) {
		return Launch{}, shapeErr(name, "gate and up together: %d gate and %d up slots (at most %d experts), %d rows a thread (even), SwiGLU input %v, upper half %d",
			len(slots), len(g.upSlots), MaxGroup/2, cfg.Rows, xUpper >= 0, yUpper)
	}
	if err := checkQ4KConfig(name, cfg); err != nil {
		return Launch{}, err
	}
	slotBytes := abi.Q4K.Bytes(rows * cols)
	maxSlot := 0
	for _, ss := range [2][]int{slots, g.upSlots} {
		for _, s := range ss {
			if s < 0 {
				return Launch{}, shapeErr(name, "negative slot %d", s)
			}
			maxSlot = max(maxSlot, s)
		}
	}
	yBytes := uint64(outs * rows * 4)
	for _, e := range experts {
		if e&MaskedUpper != 0 && glu {
			return Launch{}, shapeErr(name, "expert %d to the upper half with gate and up together", e&^MaskedUpper)
		}
		if e&MaskedUpper != 0 {
			yBytes = uint64(yUpper) + uint64(outs*rows*4)
			e &^= MaskedUpper
		}
		if e < 0 || e >= MaskedUpper {
			return Launch{}, shapeErr(name, "expert %d", e)
		}
	}
	if uint64(maxSlot+1)*slotBytes/16 > math.MaxUint32 {
		return Launch{}, shapeErr(name, "slot %d is beyond 64 GiB", maxSlot)
	}
	nx := outs
	if sharedX {
		nx = 1
	}
	xBytes, xstride := uint64(cols*4), uint32(cols/4)
	if g.xq {
		xBytes = XQBytes(cols)
		xstride = uint32(xBytes / 16)
	}
	binds := []Binding{{"weight arena", uint64(maxSlot+1) * slotBytes}, {"x", uint64(nx) * xBytes}, {"y", yBytes}}
	perWG := cfg.rowsPerWG()
	if glu {
		perWG /= 2 // each output row takes a gate and an up row
	}
	gx, gy := grid(ceilDiv(uint64(rows), perWG))
	if sharedX {
		xstride = 0
	}
	params := gpu.Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(1).U32(gx).
		U32(uint32(slotBytes / 16)).U32(xstride).U32(uint32(kSel))
	table := func(v []int) {
		for i := range MaxGroup {
			s := 0
			if i < len(v) {
				s = v[i]
			}
			params = params.U32(uint32(s))
		}
	}
	if glu {
		// Gate slots in entries 0..7, up slots in 8..15.
		table(append(append(slices.Clip(slots), make([]int, MaxGroup/2-len(slots))...), g.upSlots...))
	} else {
		table(slots)
	}
	consts := q4kConsts(cfg, 1)
	consts["GROUPED"] = 1
	groups := [3]uint32{gx, gy, uint32(len(slots))}
	if experts == nil {
		if g.yq {
			binds = append(binds, Binding{"quantized y", XQBytes(len(slots) * rows)})
		}
		return Launch{Kernel: name, Constants: consts, Groups: groups, Params: params, Bindings: binds}, nil
	}
	table(experts)
	params = params.U32(uint32(yUpper / 4)).U32(uint32(max(xUpper, 0) / 16)).U32(0).U32(0)
	if xUpper >= 0 {
		consts["SWIGLU"] = 1
	}
	binds = append(binds, Binding{"sel", uint64(kSel * 4)})
	if g.yq {
		binds = append(binds, Binding{"quantized y", uint64(kSel) * XQBytes(rows)})
	}
	if g.normed.Parts != nil {
		params = normParams(params, 176, g.normed.Eps, cols)
		binds = append(binds, Binding{"partial sums", uint64(AccumParts(cols) * 4)})
	}
	return Launch{Kernel: name, Constants: consts, Groups: groups, Params: params, Bindings: binds}, nil
}

// Q4KDequantLaunch is the dispatch rule of Q4KDequant. Bindings: weights, y.
func Q4KDequantLaunch(out abi.DType, n int) (Launch, error) {
	const name = "q4k_dequant"
	if n <= 0 || n%256 != 0 || (out != abi.F32 && out != abi.F16) {
		return Launch{}, shapeErr(name, "%d weights to %v (want a positive multiple of 256, to f32 or f16)", n, out)
	}
	blocks := uint64(n / 256)
	gx, gy := grid(ceilDiv(blocks*8, 256))
	return Launch{Kernel: name, Constants: map[string]float64{"OUT_F16": b2f(out == abi.F16)}, Groups: [3]uint32{gx, gy, 1},
		Params:   gpu.Params{}.U32(uint32(blocks)).U32(gx),
		Bindings: []Binding{{"weights", abi.Q4K.Bytes(n)}, {"y", out.Bytes(n)}}}, nil
}

// Q4KDequant records y = dequantize(w) for n weights (a multiple of 256)
// into f32 (out F32) or packed f16 (out F16).
func (k *Kernels) Q4KDequant(ctx context.Context, b *gpu.Batch, out abi.DType, w, y gpu.Region, n int) error {
	l, err := Q4KDequantLaunch(out, n)
	return k.launch(ctx, b, l, err, w, y)
}

// MatVec records y = W x with W of type dt (rows x cols, row-major).
func (k *Kernels) MatVec(ctx context.Context, b *gpu.Batch, dt abi.DType, w, x, y gpu.Region, rows, cols int) error {
	return k.MatMul(ctx, b, dt, w, x, y, MatShape{Rows: rows, Cols: cols, Tokens: 1})
}

// MatMul records y[t] = W x[t] for s.Tokens tokens, W of type dt. Q4K
// needs Cols % 256 == 0.
func (k *Kernels) MatMul(ctx context.Context, b *gpu.Batch, dt abi.DType, w, x, y gpu.Region, s MatShape) error {
	if dt == abi.Q4K {
		return k.Q4KMatMul(ctx, b, w, x, y, s)
	}
	l, err := DenseLaunch(dt, s)
	return k.launch(ctx, b, l, err, w, x, y)
}

// MatVecNormed records y = W RMSNorm(x) for f32 weights W from n (see
// Normed): dense_matmul_part, the norm's dispatch gone.
func (k *Kernels) MatVecNormed(ctx context.Context, b *gpu.Batch, w gpu.Region, n Normed, y gpu.Region, rows, cols int) error {
	l, err := DensePartLaunch(rows, cols, n)
	return k.launch(ctx, b, l, err, w, n.XG, y, n.Parts)
}

// DensePartLaunch is the dispatch rule of MatVecNormed. Bindings:
// weights, x * g, y, partial sums.
func DensePartLaunch(rows, cols int, n Normed) (Launch, error) {
	const name = "dense_matmul_part"
	if err := checkParts(name, cols); err != nil {
		return Launch{}, err
	}
	l, err := DenseLaunch(abi.F32, MatShape{Rows: rows, Cols: cols, Tokens: 1})
	if err != nil {
		return Launch{}, err
	}
	l.Kernel = name
	l.Params = l.Params.F32(n.Eps).U32(uint32(AccumParts(cols)))
	l.Bindings = append(l.Bindings, Binding{"partial sums", uint64(AccumParts(cols) * 4)})
	return l, nil
}

// DenseLaunch is the dispatch rule of MatMul for f32 and f16 weights:
// dense_matmul, 2 rows a workgroup, the 16-byte path when rows allow it.
// Bindings: weights, x, y.
func DenseLaunch(dt abi.DType, s MatShape) (Launch, error) {
	const name = "dense_matmul"
	rows, cols, n := s.Rows, s.Cols, s.Tokens
	if rows <= 0 || cols <= 0 || n <= 0 || (dt != abi.F32 && dt != abi.F16) {
		return Launch{}, shapeErr(name, "rows %d, cols %d, tokens %d, %v", rows, cols, n, dt)
	}
	vec := (dt == abi.F32 && cols%4 == 0) || (dt == abi.F16 && cols%8 == 0)
	tok := tokTile(n)
	const rowsPerWG = 2
	gx, gy := grid(ceilDiv(uint64(rows), rowsPerWG))
	gz := ceilDiv(uint64(n), uint64(tok))
	if gz > 65535 {
		return Launch{}, shapeErr(name, "%d tokens is too many", n)
	}
	return Launch{Kernel: name, Constants: map[string]float64{"ROWS": rowsPerWG, "TOK": float64(tok), "W_F16": b2f(dt == abi.F16)},
		Groups:   [3]uint32{gx, gy, uint32(gz)},
		Params:   gpu.Params{}.U32(uint32(rows)).U32(uint32(cols)).U32(uint32(n)).U32(gx).U32(b2u(vec)),
		Bindings: []Binding{{"weights", dt.Bytes(rows * cols)}, {"x", uint64(n * cols * 4)}, {"y", uint64(n * rows * 4)}}}, nil
}
