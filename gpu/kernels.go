package gpu

import (
	"context"
	"embed"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"sync"
)

//go:embed wgsl/*.wgsl
var wgslFiles embed.FS

// DType is the element type of a weight or table buffer.
type DType int

const (
	F32 DType = iota // float32
	F16              // IEEE binary16, two per 32-bit word
	Q4K              // GGML block_q4_K: 144 bytes per 256 weights
)

func (t DType) String() string {
	switch t {
	case F32:
		return "f32"
	case F16:
		return "f16"
	case Q4K:
		return "q4_k"
	}
	return fmt.Sprintf("DType(%d)", int(t))
}

// Bytes is the size of n elements (n a multiple of 256 for Q4K).
func (t DType) Bytes(n int) uint64 {
	switch t {
	case F16:
		return uint64(n) * 2
	case Q4K:
		return uint64(n) / 256 * 144
	}
	return uint64(n) * 4
}

// builtin describes a built-in kernel: its WGSL file and ABI, and the
// flavor of the file it is (see flavored).
type builtin struct {
	file     string
	bindings []Access
	params   int
	flavor   string
}

// flavored returns src as flavor f: a line starting with "//+f " is kept
// (without the marker) only in flavor f, one starting with "//-f " only
// outside it. One WGSL file then holds kernels that differ in a binding or
// a field, which WGSL's override constants cannot add or remove.
func flavored(src string, f string) string {
	if !strings.Contains(src, "//+") && !strings.Contains(src, "//-") {
		return src
	}
	lines := strings.SplitAfter(src, "\n")
	out := lines[:0]
	for _, l := range lines {
		t := strings.TrimLeft(l, " ")
		switch {
		case strings.HasPrefix(t, "//+"):
			name, rest, _ := strings.Cut(t[3:], " ")
			if name != f {
				continue
			}
			l = rest
		case strings.HasPrefix(t, "//-"):
			name, rest, _ := strings.Cut(t[3:], " ")
			if name == f {
				continue
			}
			l = rest
		}
		out = append(out, l)
	}
	return strings.Join(out, "")
}

// builtins is a read-only table of the built-in kernels.
var builtins = map[string]builtin{
	"q4k_matmul":        {"q4k_matmul.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 96, ""},
	"q4k_matmul_masked": {"q4k_matmul.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite, ReadOnly}, 176, "MASKED"},
	"q4k_dequant":       {"q4k_dequant.wgsl", []Access{ReadOnly, ReadWrite}, 8, ""},
	"q4k_matvec_co":     {"q4k_matvec_co.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 20, ""},
	"dense_matmul":      {"dense_matmul.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 20, ""},
	"rmsnorm":           {"rmsnorm.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 16, ""},
	"softmax":           {"softmax.wgsl", []Access{ReadOnly, ReadWrite}, 12, ""},
	"rope":              {"rope.wgsl", []Access{ReadWrite, ReadOnly}, 28, ""},
	"attention":         {"attention.wgsl", []Access{ReadOnly, ReadOnly, ReadOnly, ReadWrite}, 20, ""}, // one workgroup per head: the kernel lab's single-dispatch baseline
	"attention_split":   {"attention_split.wgsl", []Access{ReadOnly, ReadOnly, ReadOnly, ReadWrite}, 32, ""},
	"attention_merge":   {"attention_merge.wgsl", []Access{ReadOnly, ReadWrite}, 16, ""},
	"route":             {"route.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite, ReadWrite}, 32, ""},
	"swiglu":            {"swiglu.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 8, ""},
	"accumulate":        {"accumulate.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 16, ""},
	"embed":             {"embed.wgsl", []Access{ReadOnly, ReadOnly, ReadWrite}, 16, ""},
	"argmax":            {"argmax.wgsl", []Access{ReadOnly, ReadWrite}, 4, ""}, // one workgroup: the kernel lab's baseline
	"argmax_blocks":     {"argmax_blocks.wgsl", []Access{ReadOnly, ReadWrite}, 16, ""},
	"topp":              {"topp.wgsl", []Access{ReadOnly, ReadWrite}, 16, ""},
	"copy":              {"copy.wgsl", []Access{ReadOnly, ReadWrite}, 8, ""},
	"kv_store":          {"kv_store.wgsl", []Access{ReadOnly, ReadWrite, ReadWrite}, 16, ""},
}

// BuiltinNames lists the built-in kernels.
func BuiltinNames() []string {
	names := make([]string, 0, len(builtins))
	for n := range builtins {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Builtin returns the descriptor of a built-in kernel with the given
// constants (nil for the defaults): the baseline that the kernel lab
// measures variants against, and a template for third-party WGSL with the
// same ABI.
func Builtin(name string, constants map[string]float64) (Kernel, error) {
	b, ok := builtins[name]
	if !ok {
		return Kernel{}, fmt.Errorf("%w: no built-in kernel %q", ErrCompile, name)
	}
	src, err := wgslFiles.ReadFile("wgsl/" + b.file)
	if err != nil {
		return Kernel{}, err
	}
	return Kernel{Name: name, Source: flavored(string(src), b.flavor), Constants: constants, Bindings: b.bindings, Params: b.params}, nil
}

// Kernels runs the built-in kernels on a device. Pipelines compile on first
// use (one per constant variant) and stay until Close. Methods record into
// a Batch and never wait for the GPU; ctx bounds compilation. Safe for
// concurrent use (each Batch by one goroutine).
type Kernels struct {
	d      *Device
	mu     sync.Mutex
	pipes  map[string]*Pipeline
	closed bool
}

// NewKernels prepares the built-in kernels for d.
func NewKernels(d *Device) *Kernels { return &Kernels{d: d, pipes: map[string]*Pipeline{}} }

// Close releases the kernels' pipelines.
func (k *Kernels) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	for _, p := range k.pipes {
		p.Release()
	}
	k.pipes = map[string]*Pipeline{}
}

func (k *Kernels) pipeline(ctx context.Context, name string, consts map[string]float64) (*Pipeline, error) {
	// The key is built on every dispatch: no fmt, one allocation.
	key := name
	if len(consts) > 0 {
		var names [16]string
		cs := names[:0]
		for c := range consts {
			cs = append(cs, c)
		}
		sort.Strings(cs)
		buf := make([]byte, 0, 64)
		buf = append(buf, name...)
		for _, c := range cs {
			buf = append(buf, ',')
			buf = append(buf, c...)
			buf = append(buf, '=')
			buf = strconv.AppendFloat(buf, consts[c], 'g', -1, 64)
		}
		key = string(buf)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, &KernelError{Kernel: name, Op: "compile", Err: ErrClosed}
	}
	if p, ok := k.pipes[key]; ok {
		return p, nil
	}
	spec, err := Builtin(name, consts)
	if err != nil {
		return nil, err
	}
	p, err := k.d.Compile(ctx, spec)
	if err != nil {
		return nil, err
	}
	k.pipes[key] = p
	return p, nil
}

// Prepare compiles the default variants of every built-in kernel, so that
// the first decode step does not pay for compilation.
func (k *Kernels) Prepare(ctx context.Context) error {
	for _, n := range BuiltinNames() {
		if _, err := k.pipeline(ctx, n, nil); err != nil {
			return err
		}
	}
	return nil
}

// run compiles (if needed) and records one dispatch.
func (k *Kernels) run(ctx context.Context, b *Batch, name string, consts map[string]float64, groups [3]uint32, params Params, bind ...Region) error {
	p, err := k.pipeline(ctx, name, consts)
	if err != nil {
		return b.note(err)
	}
	return b.Dispatch(p, groups, params, bind...)
}

func shapeErr(kernel, format string, args ...any) error {
	return &KernelError{Kernel: kernel, Op: "shape", Err: fmt.Errorf("%w: "+format, append([]any{ErrShape}, args...)...)}
}

// need checks that r holds at least n bytes.
func need(kernel, what string, r Region, n uint64) error {
	if r == nil {
		return shapeErr(kernel, "%s is nil", what)
	}
	if s := r.span(); s.size < n {
		return shapeErr(kernel, "%s holds %d bytes; the shape needs %d", what, s.size, n)
	}
	return nil
}

// grid spreads n workgroups over x and y (each <= 65535).
func grid(n uint64) (gx, gy uint32) {
	if n <= 65535 {
		return uint32(max(n, 1)), 1
	}
	gy = uint32((n + 65534) / 65535)
	gx = uint32((n + uint64(gy) - 1) / uint64(gy))
	return gx, gy
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

func floorPow2(n uint64) uint64 {
	if n == 0 {
		return 1
	}
	return 1 << (bits.Len64(n) - 1)
}

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
// (see BENCHMARKS.md). Large matrices: 2 or 4 block slots and 8 rows per
// thread with software pipelining, so each thread keeps many independent
// loads in flight and reads x once for 8 rows. Smaller matrices: more
// threads. Tiny matrices, few rows and small batches (n > 1): the simple
// layout.
//
// With very long rows (>= 8192 columns) two slots gain little when many
// independent products run back to back and halve the speed of a lone
// product, so four are used there.
func DefaultQ4KConfig(rows, cols, n int) Q4KConfig {
	nb := uint64(cols / 256)
	switch {
	case n > 1 || rows < 256 || rows*cols < 1<<20:
		return Q4KConfig{SPR: int(min(32, floorPow2(nb))), Rows: 2}
	case rows*cols <= 16<<20:
		return Q4KConfig{WG: 256, SPR: int(min(4, floorPow2(nb))), Rows: 4}
	case nb <= 8:
		// Short rows in bulk (a group of expert down projections,
		// 2048 columns): one block slot, each thread walks the whole
		// row for 8 rows (H100, 8 x 7168x2048: 0.73x of copy against
		// 0.39-0.64x for 2-8 slots).
		return Q4KConfig{WG: 128, SPR: 1, Rows: 8, Pipeline: true}
	case nb >= 32:
		return Q4KConfig{WG: 64, SPR: 4, Rows: 8, Pipeline: true}
	case nb >= 16:
		return Q4KConfig{WG: 64, SPR: 2, Rows: 8, Pipeline: true}
	default:
		return Q4KConfig{WG: 128, SPR: int(min(4, floorPow2(nb))), Rows: 8}
	}
}

// Q4KMatVec records y = W x for W (rows x cols, Q4_K rows), x (cols f32),
// y (rows f32). cols must be a multiple of 256.
func (k *Kernels) Q4KMatVec(ctx context.Context, b *Batch, w, x, y Region, rows, cols int) error {
	return k.Q4KMatMul(ctx, b, w, x, y, rows, cols, 1)
}

// Q4KMatMul records y[t] = W x[t] for n tokens (x [n][cols], y [n][rows]).
func (k *Kernels) Q4KMatMul(ctx context.Context, b *Batch, w, x, y Region, rows, cols, n int) error {
	return k.Q4KMatMulWith(ctx, b, DefaultQ4KConfig(rows, cols, n), w, x, y, rows, cols, n)
}

// Q4KMatMulWith is Q4KMatMul with an explicit configuration (benchmarks and
// the kernel lab sweep it).
func (k *Kernels) Q4KMatMulWith(ctx context.Context, b *Batch, cfg Q4KConfig, w, x, y Region, rows, cols, n int) error {
	return k.q4kMatMul(ctx, b, cfg, w, x, y, rows, cols, n, false)
}

// Q4KMatVecAdd records y += W x (a product added into a residual stream,
// one dispatch instead of a product and an Accumulate).
func (k *Kernels) Q4KMatVecAdd(ctx context.Context, b *Batch, w, x, y Region, rows, cols int) error {
	cfg := DefaultQ4KConfig(rows, cols, 1)
	cfg.Coalesced = false // the q4k_matvec_co kernel only stores
	return k.q4kMatMul(ctx, b, cfg, w, x, y, rows, cols, 1, true)
}

func (k *Kernels) q4kMatMul(ctx context.Context, b *Batch, cfg Q4KConfig, w, x, y Region, rows, cols, n int, acc bool) error {
	const name = "q4k_matmul"
	if rows <= 0 || cols <= 0 || n <= 0 || cols%256 != 0 {
		return b.note(shapeErr(name, "rows %d, cols %d, tokens %d (cols must be a positive multiple of 256)", rows, cols, n))
	}
	if err := checkQ4KConfig(name, cfg); err != nil {
		return b.note(err)
	}
	wg := cfg.wg()
	if err := need(name, "weights", w, Q4K.Bytes(rows*cols)); err != nil {
		return b.note(err)
	}
	if err := need(name, "x", x, uint64(n*cols*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "y", y, uint64(n*rows*4)); err != nil {
		return b.note(err)
	}
	tok := tokTile(n)
	rowsPerWG := uint64(cfg.Rows * wg / 8 / cfg.SPR)
	gx, gy := grid(ceilDiv(uint64(rows), rowsPerWG))
	gz := ceilDiv(uint64(n), uint64(tok))
	if gz > 65535 {
		return b.note(shapeErr(name, "%d tokens is too many", n))
	}
	if cfg.Coalesced && n == 1 && wg == 256 {
		params := Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(1).U32(gx)
		return k.run(ctx, b, "q4k_matvec_co", map[string]float64{"ROWS": float64(cfg.Rows)}, [3]uint32{gx, gy, 1}, params, w, x, y)
	}
	params := Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(uint32(n)).U32(gx)
	consts := q4kConsts(cfg, tok)
	if acc {
		consts["ACC"] = 1
	}
	return k.run(ctx, b, name, consts, [3]uint32{gx, gy, uint32(gz)}, params, w, x, y)
}

func (cfg Q4KConfig) wg() int {
	if cfg.WG == 0 {
		return 256
	}
	return cfg.WG
}

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
	b2f := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	return map[string]float64{"ROWS": float64(cfg.Rows), "TOK": float64(tok), "CONV": b2f(!cfg.Convert),
		"PIPE": b2f(cfg.Pipeline), "POS": b2f(!cfg.Shifts), "WG": float64(cfg.wg())}
}

// MaxGroup is the most products one Q4KMatVecGroup dispatch runs.
const MaxGroup = 16

// Q4KMatVecGroup records len(slots) independent products in one dispatch:
// y[e] = W[slots[e]] x[e] for e < len(slots) <= MaxGroup, where arena holds
// equal slots of rows x cols Q4_K matrices (slot s at byte s *
// Q4K.Bytes(rows*cols)), x holds one cols-vector per product (or one for
// all if sharedX), and y receives the products' rows one after another.
// This is how an MoE layer's expert products run: one launch for all of
// them, the weights wherever the expert cache put them.
func (k *Kernels) Q4KMatVecGroup(ctx context.Context, b *Batch, arena Region, slots []int, x Region, sharedX bool, y Region, rows, cols int) error {
	return k.Q4KMatVecGroupWith(ctx, b, DefaultQ4KConfig(rows*len(slots), cols, 1), arena, slots, x, sharedX, y, rows, cols)
}

// Q4KMatVecGroupWith is Q4KMatVecGroup with an explicit configuration.
func (k *Kernels) Q4KMatVecGroupWith(ctx context.Context, b *Batch, cfg Q4KConfig, arena Region, slots []int, x Region, sharedX bool, y Region, rows, cols int) error {
	return k.q4kGroup(ctx, b, cfg, groupCall{arena: arena, slots: slots, x: x, sharedX: sharedX, xUpper: -1, y: y, rows: rows, cols: cols})
}

// Masked is an MoE layer's expert products with the router's choice left
// on the GPU (Q4KMatVecMasked): product e is expert Experts[e], its
// matrix in Arena slot Slots[e] (equal slots of Rows x Cols Q4_K
// matrices), and Sel holds the K expert ids the router chose (u32, as
// Route writes them).
type Masked struct {
	Arena   Region
	Slots   []int
	Experts []int // an entry with MaskedUpper set writes YUpper bytes further into Y
	Sel     Region
	K       int
	X       Region // K cols-vectors, or one for all if SharedX
	SharedX bool
	Y       Region
	YUpper  int // a multiple of 4
	Rows    int
	Cols    int
}

func (m Masked) call() groupCall {
	return groupCall{arena: m.Arena, slots: m.Slots, experts: m.Experts, sel: m.Sel, kSel: m.K,
		x: m.X, sharedX: m.SharedX, xUpper: -1, y: m.Y, yUpper: m.YUpper, rows: m.Rows, cols: m.Cols}
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
func (k *Kernels) Q4KMatVecMasked(ctx context.Context, b *Batch, m Masked) error {
	return k.q4kMasked(ctx, b, m.call())
}

// Q4KMatVecMaskedSwiGLU is Q4KMatVecMasked for an MoE layer's down
// products straight from its gate and up products: product j's x is
// silu(gate[j]) * up[j], gate rows of Cols floats from m.X's start, up
// rows from byte upOff (a multiple of 16); m.SharedX and m.YUpper are
// not used. It saves the SwiGLU dispatch.
func (k *Kernels) Q4KMatVecMaskedSwiGLU(ctx context.Context, b *Batch, m Masked, upOff int) error {
	if upOff < m.K*m.Cols*4 || upOff%16 != 0 {
		return b.note(shapeErr("q4k_matmul_masked", "up half at byte %d of %d gate rows of %d", upOff, m.K, m.Cols))
	}
	if err := need("q4k_matmul_masked", "gate and up", m.X, uint64(upOff+m.K*m.Cols*4)); err != nil {
		return b.note(err)
	}
	g := m.call()
	g.sharedX, g.xUpper, g.yUpper = false, upOff, 0
	return k.q4kMasked(ctx, b, g)
}

func (k *Kernels) q4kMasked(ctx context.Context, b *Batch, g groupCall) error {
	if len(g.experts) != len(g.slots) || g.kSel <= 0 || g.kSel > 32 || g.yUpper < 0 || g.yUpper%4 != 0 {
		return b.note(shapeErr("q4k_matmul_masked", "%d experts for %d slots, %d chosen (1..32), upper half at byte %d", len(g.experts), len(g.slots), g.kSel, g.yUpper))
	}
	return k.q4kGroup(ctx, b, DefaultQ4KConfig(g.rows*min(g.kSel, len(g.slots)), g.cols, 1), g)
}

// groupCall is one Q4KMatVecGroup or Q4KMatVecMasked dispatch: the
// products (weights at arena slots; experts, sel and kSel when masked),
// their input (xUpper >= 0, masked only: x is SwiGLU of gate rows and up
// rows xUpper bytes further) and their output (yUpper: the upper half).
type groupCall struct {
	arena          Region
	slots, experts []int
	sel            Region
	kSel           int
	x              Region
	sharedX        bool
	xUpper         int
	y              Region
	yUpper         int
	rows, cols     int
}

// MaskedUpper marks a Q4KMatVecMasked product whose output goes to the
// upper half of y.
const MaskedUpper = 1 << 31

// q4kGroup records Q4KMatVecGroupWith, or Q4KMatVecMasked when g.experts
// is not nil.
func (k *Kernels) q4kGroup(ctx context.Context, b *Batch, cfg Q4KConfig, g groupCall) error {
	arena, slots, experts, sel, kSel, x, sharedX, xUpper, y, yUpper, rows, cols :=
		g.arena, g.slots, g.experts, g.sel, g.kSel, g.x, g.sharedX, g.xUpper, g.y, g.yUpper, g.rows, g.cols
	name := "q4k_matmul"
	outs := len(slots) // products whose output y holds
	if experts != nil {
		name, outs = "q4k_matmul_masked", kSel
	}
	if rows <= 0 || cols <= 0 || cols%256 != 0 || len(slots) == 0 || len(slots) > MaxGroup {
		return b.note(shapeErr(name, "group of %d products of %dx%d (1..%d products; cols a positive multiple of 256)", len(slots), rows, cols, MaxGroup))
	}
	if err := checkQ4KConfig(name, cfg); err != nil {
		return b.note(err)
	}
	slotBytes := Q4K.Bytes(rows * cols)
	maxSlot := 0
	for _, s := range slots {
		if s < 0 {
			return b.note(shapeErr(name, "negative slot %d", s))
		}
		maxSlot = max(maxSlot, s)
	}
	yBytes := uint64(outs * rows * 4)
	for _, e := range experts {
		if e&MaskedUpper != 0 {
			yBytes = uint64(yUpper) + uint64(outs*rows*4)
			e &^= MaskedUpper
		}
		if e < 0 || e >= MaskedUpper {
			return b.note(shapeErr(name, "expert %d", e))
		}
	}
	if err := need(name, "weight arena", arena, uint64(maxSlot+1)*slotBytes); err != nil {
		return b.note(err)
	}
	if uint64(maxSlot+1)*slotBytes/16 > math.MaxUint32 {
		return b.note(shapeErr(name, "slot %d is beyond 64 GiB", maxSlot))
	}
	nx := outs
	if sharedX {
		nx = 1
	}
	if err := need(name, "x", x, uint64(nx*cols*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "y", y, yBytes); err != nil {
		return b.note(err)
	}
	if experts != nil {
		if err := need(name, "sel", sel, uint64(kSel*4)); err != nil {
			return b.note(err)
		}
	}
	rowsPerWG := uint64(cfg.Rows * cfg.wg() / 8 / cfg.SPR)
	gx, gy := grid(ceilDiv(uint64(rows), rowsPerWG))
	xstride := uint32(cols / 4)
	if sharedX {
		xstride = 0
	}
	params := Params{}.U32(uint32(rows)).U32(uint32(cols / 256)).U32(uint32(cfg.SPR)).U32(1).U32(gx).
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
	table(slots)
	consts := q4kConsts(cfg, 1)
	consts["GROUPED"] = 1
	if experts == nil {
		return k.run(ctx, b, name, consts, [3]uint32{gx, gy, uint32(len(slots))}, params, arena, x, y)
	}
	table(experts)
	params = params.U32(uint32(yUpper / 4)).U32(uint32(max(xUpper, 0) / 16)).U32(0).U32(0)
	if xUpper >= 0 {
		consts["SWIGLU"] = 1
	}
	return k.run(ctx, b, name, consts, [3]uint32{gx, gy, uint32(len(slots))}, params, arena, x, y, sel)
}

// Q4KDequant records y = dequantize(w) for n weights (a multiple of 256)
// into f32 (out F32) or packed f16 (out F16).
func (k *Kernels) Q4KDequant(ctx context.Context, b *Batch, out DType, w, y Region, n int) error {
	const name = "q4k_dequant"
	if n <= 0 || n%256 != 0 || (out != F32 && out != F16) {
		return b.note(shapeErr(name, "%d weights to %v (want a positive multiple of 256, to f32 or f16)", n, out))
	}
	if err := need(name, "weights", w, Q4K.Bytes(n)); err != nil {
		return b.note(err)
	}
	if err := need(name, "y", y, out.Bytes(n)); err != nil {
		return b.note(err)
	}
	blocks := uint64(n / 256)
	gx, gy := grid(ceilDiv(blocks*8, 256))
	f16 := 0.0
	if out == F16 {
		f16 = 1
	}
	return k.run(ctx, b, name, map[string]float64{"OUT_F16": f16}, [3]uint32{gx, gy, 1},
		Params{}.U32(uint32(blocks)).U32(gx), w, y)
}

// MatVec records y = W x with W of type dt (rows x cols, row-major).
func (k *Kernels) MatVec(ctx context.Context, b *Batch, dt DType, w, x, y Region, rows, cols int) error {
	return k.MatMul(ctx, b, dt, w, x, y, rows, cols, 1)
}

// MatMul records y[t] = W x[t] for n tokens (x [n][cols] f32, y [n][rows]
// f32), W of type dt. Q4K needs cols % 256 == 0.
func (k *Kernels) MatMul(ctx context.Context, b *Batch, dt DType, w, x, y Region, rows, cols, n int) error {
	if dt == Q4K {
		return k.Q4KMatMul(ctx, b, w, x, y, rows, cols, n)
	}
	const name = "dense_matmul"
	if rows <= 0 || cols <= 0 || n <= 0 || (dt != F32 && dt != F16) {
		return b.note(shapeErr(name, "rows %d, cols %d, tokens %d, %v", rows, cols, n, dt))
	}
	if err := need(name, "weights", w, dt.Bytes(rows*cols)); err != nil {
		return b.note(err)
	}
	if err := need(name, "x", x, uint64(n*cols*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "y", y, uint64(n*rows*4)); err != nil {
		return b.note(err)
	}
	vec := uint32(0)
	if (dt == F32 && cols%4 == 0) || (dt == F16 && cols%8 == 0) {
		vec = 1
	}
	tok := tokTile(n)
	const rowsPerWG = 2
	gx, gy := grid(ceilDiv(uint64(rows), rowsPerWG))
	gz := ceilDiv(uint64(n), uint64(tok))
	if gz > 65535 {
		return b.note(shapeErr(name, "%d tokens is too many", n))
	}
	f16 := 0.0
	if dt == F16 {
		f16 = 1
	}
	consts := map[string]float64{"ROWS": rowsPerWG, "TOK": float64(tok), "W_F16": f16}
	params := Params{}.U32(uint32(rows)).U32(uint32(cols)).U32(uint32(n)).U32(gx).U32(vec)
	return k.run(ctx, b, name, consts, [3]uint32{gx, gy, uint32(gz)}, params, w, x, y)
}

// RMSNorm records y = x / sqrt(mean(x^2) + eps) * w over n rows of d.
// y must be another buffer than x and w (see Batch.Dispatch).
func (k *Kernels) RMSNorm(ctx context.Context, b *Batch, x, w, y Region, n, d int, eps float32) error {
	const name = "rmsnorm"
	if n <= 0 || d <= 0 {
		return b.note(shapeErr(name, "%d rows of %d", n, d))
	}
	for _, c := range []struct {
		what string
		r    Region
		n    int
	}{{"x", x, n * d}, {"w", w, d}, {"y", y, n * d}} {
		if err := need(name, c.what, c.r, uint64(c.n*4)); err != nil {
			return b.note(err)
		}
	}
	gx, gy := grid(uint64(n))
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1},
		Params{}.U32(uint32(n)).U32(uint32(d)).F32(eps).U32(gx), x, w, y)
}

// Softmax records y = softmax(x) over n rows of d, y another buffer than x.
func (k *Kernels) Softmax(ctx context.Context, b *Batch, x, y Region, n, d int) error {
	const name = "softmax"
	if n <= 0 || d <= 0 {
		return b.note(shapeErr(name, "%d rows of %d", n, d))
	}
	if err := need(name, "x", x, uint64(n*d*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "y", y, uint64(n*d*4)); err != nil {
		return b.note(err)
	}
	gx, gy := grid(uint64(n))
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, Params{}.U32(uint32(n)).U32(uint32(d)).U32(gx), x, y)
}

// RopeStyle says which elements rotate together (same values as ref.RopeStyle).
type RopeStyle int

const (
	RopeNeoX RopeStyle = iota // element i with i + rot/2
	RopeGPTJ                  // element 2i with 2i + 1
)

// RopeShape describes a RoPE call: x is [Tokens][Heads][HeadDim]; the first
// RotDim elements of each head rotate at position Pos0 + token.
type RopeShape struct {
	Tokens, Heads, HeadDim, RotDim, Pos0 int
	Style                                RopeStyle
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

// Rope records the rotation of x in place by freqs (RotDim/2 f32 values,
// see RopeFreqs).
func (k *Kernels) Rope(ctx context.Context, b *Batch, x, freqs Region, s RopeShape) error {
	const name = "rope"
	if s.Tokens <= 0 || s.Heads <= 0 || s.HeadDim <= 0 || s.RotDim <= 0 || s.RotDim%2 != 0 || s.RotDim > s.HeadDim || s.Pos0 < 0 {
		return b.note(shapeErr(name, "%+v", s))
	}
	if err := need(name, "x", x, uint64(s.Tokens*s.Heads*s.HeadDim*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "freqs", freqs, uint64(s.RotDim/2*4)); err != nil {
		return b.note(err)
	}
	total := uint64(s.Tokens * s.Heads * s.RotDim / 2)
	gx, gy := grid(ceilDiv(total, 256))
	p := Params{}.U32(uint32(s.Tokens)).U32(uint32(s.Heads)).U32(uint32(s.HeadDim)).U32(uint32(s.RotDim)).
		U32(uint32(s.Pos0)).U32(uint32(s.Style)).U32(gx)
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, p, x, freqs)
}

// AttnShape describes decode attention: Heads query heads of HeadDim
// (<= 256, a multiple of 4), KVHeads cache heads (Heads a multiple of it;
// 8 query heads of HeadDim at most 1024 dimensions), KVLen cached positions; Scale multiplies q.k
// (usually 1/sqrt(HeadDim)).
type AttnShape struct {
	Heads, KVHeads, HeadDim, KVLen int
	Scale                          float32
}

// attnChunk is the positions one attention_split workgroup takes.
const attnChunk = 64

// Attention records decode attention of q ([Heads][HeadDim]) over the
// cache k, v ([>= KVLen][KVHeads][HeadDim]) into out ([Heads][HeadDim]).
// It runs split over positions (flash-decoding): chunks of 64 positions
// per workgroup, every cache head's query heads together, then a merge of
// the chunks' softmax partials; the partials live in a scratch buffer of
// the batch.
func (k *Kernels) Attention(ctx context.Context, b *Batch, q, kc, vc, out Region, s AttnShape) error {
	const name = "attention"
	if s.Heads <= 0 || s.KVHeads <= 0 || s.Heads%s.KVHeads != 0 || s.HeadDim <= 0 || s.HeadDim > 256 || s.HeadDim%4 != 0 ||
		s.KVLen <= 0 || s.Heads > 65535 || min(s.Heads/s.KVHeads, 8)*s.HeadDim > 1024 || s.KVLen > 1<<24 {
		return b.note(shapeErr(name, "%+v (HeadDim <= 256 and a multiple of 4; Heads a multiple of KVHeads; at most 1024 dimensions in 8 query heads; KVLen <= 2^24)", s))
	}
	kv := uint64(s.KVLen * s.KVHeads * s.HeadDim * 4)
	for _, c := range []struct {
		what string
		r    Region
		n    uint64
	}{{"q", q, uint64(s.Heads * s.HeadDim * 4)}, {"k", kc, kv}, {"v", vc, kv}, {"out", out, uint64(s.Heads * s.HeadDim * 4)}} {
		if err := need(name, c.what, c.r, c.n); err != nil {
			return b.note(err)
		}
	}
	chunks := (s.KVLen + attnChunk - 1) / attnChunk
	part, err := b.temp(uint64(s.Heads * chunks * (s.HeadDim + 2) * 4))
	if err != nil {
		return err
	}
	p := Params{}.U32(uint32(s.Heads)).U32(uint32(s.KVHeads)).U32(uint32(s.HeadDim)).U32(uint32(s.KVLen)).F32(s.Scale).
		U32(uint32(chunks)).U32(0).U32(0)
	groups := (s.Heads/s.KVHeads + 7) / 8 // query heads of a cache head, 8 a workgroup
	if err := k.run(ctx, b, "attention_split", nil, [3]uint32{uint32(chunks), uint32(s.KVHeads), uint32(groups)}, p, q, kc, vc, part); err != nil {
		return err
	}
	p = Params{}.U32(uint32(s.Heads)).U32(uint32(s.HeadDim)).U32(uint32(chunks)).U32(0)
	return k.run(ctx, b, "attention_merge", nil, [3]uint32{uint32(s.Heads), 1, 1}, p, part, out)
}

// RouteMode selects how router logits become expert weights (same values
// as ref.RouteMode).
type RouteMode int

const (
	// RouteSoftmaxTopK (Mixtral): top-k logits, softmax over them.
	RouteSoftmaxTopK RouteMode = iota
	// RouteSigmoidTopK (DeepSeek-V3): sigmoid scores, selection by score +
	// bias within the best groups, weights normalized over the selection
	// and multiplied by Scale.
	RouteSigmoidTopK
)

// RouteShape describes top-k routing of Tokens rows of Experts logits.
type RouteShape struct {
	Tokens, Experts, K int
	Mode               RouteMode
	Groups, TopKGroup  int     // sigmoid mode: group-limited selection when Groups > 1
	Scale              float32 // sigmoid mode: routed scaling factor (0 means 1)
}

// Route records top-k routing: ids ([Tokens][K] u32) and weights
// ([Tokens][K] f32) from logits ([Tokens][Experts]). bias ([Experts]) may
// be nil.
func (k *Kernels) Route(ctx context.Context, b *Batch, logits, bias, ids, weights Region, s RouteShape) error {
	const name = "route"
	if s.Tokens <= 0 || s.Experts <= 0 || s.Experts > 1024 || s.K <= 0 || s.K > 32 || s.K > s.Experts {
		return b.note(shapeErr(name, "%+v (Experts <= 1024, K <= 32)", s))
	}
	groups, topk := 1, 1
	if s.Mode == RouteSigmoidTopK && s.Groups > 1 {
		groups, topk = s.Groups, s.TopKGroup
		if groups > 64 || s.Experts%groups != 0 || topk <= 0 || topk > groups || s.K > topk*(s.Experts/groups) {
			return b.note(shapeErr(name, "%+v (groups <= 64 dividing Experts, K <= TopKGroup*group size)", s))
		}
	}
	if err := need(name, "logits", logits, uint64(s.Tokens*s.Experts*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "ids", ids, uint64(s.Tokens*s.K*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "weights", weights, uint64(s.Tokens*s.K*4)); err != nil {
		return b.note(err)
	}
	hasBias := uint32(0)
	if bias != nil {
		if err := need(name, "bias", bias, uint64(s.Experts*4)); err != nil {
			return b.note(err)
		}
		hasBias = 1
	} else {
		bias = logits // bound but unread
	}
	scale := s.Scale
	if scale == 0 {
		scale = 1
	}
	gx, gy := uint32(min(s.Tokens, 65535)), uint32(ceilDiv(uint64(s.Tokens), 65535))
	p := Params{}.U32(uint32(s.Tokens)).U32(uint32(s.Experts)).U32(uint32(s.K)).U32(uint32(s.Mode)).
		U32(uint32(groups)).U32(uint32(topk)).F32(scale).U32(hasBias)
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, p, logits, bias, ids, weights)
}

// SwiGLU records y = silu(gate) * up over n elements, y another buffer.
func (k *Kernels) SwiGLU(ctx context.Context, b *Batch, gate, up, y Region, n int) error {
	const name = "swiglu"
	if n <= 0 {
		return b.note(shapeErr(name, "%d elements", n))
	}
	for _, c := range []struct {
		what string
		r    Region
	}{{"gate", gate}, {"up", up}, {"y", y}} {
		if err := need(name, c.what, c.r, uint64(n*4)); err != nil {
			return b.note(err)
		}
	}
	gx, gy := grid(ceilDiv(uint64(n), 256))
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, Params{}.U32(uint32(n)).U32(gx), gate, up, y)
}

// Accumulate records dst[i] += sum_j w[wOff+j] * src[j*d+i] for j < kExp:
// the weighted sum of kExp expert outputs (src [kExp][d]) with weights
// straight from Route.
func (k *Kernels) Accumulate(ctx context.Context, b *Batch, src, w, dst Region, kExp, d, wOff int) error {
	const name = "accumulate"
	if kExp <= 0 || d <= 0 || wOff < 0 {
		return b.note(shapeErr(name, "k %d, d %d, weight offset %d", kExp, d, wOff))
	}
	if err := need(name, "src", src, uint64(kExp*d*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "weights", w, uint64((wOff+kExp)*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "dst", dst, uint64(d*4)); err != nil {
		return b.note(err)
	}
	gx, gy := grid(ceilDiv(uint64(d), 256))
	p := Params{}.U32(uint32(d)).U32(uint32(kExp)).U32(uint32(wOff)).U32(gx)
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, p, src, w, dst)
}

// Embed records y[t] = table[ids[t]] for n token ids (u32), rows of d
// elements of type dt (Q4K needs d % 256 == 0). vocab bounds the ids the
// table holds; ids are not checked on the GPU.
func (k *Kernels) Embed(ctx context.Context, b *Batch, dt DType, table, ids, y Region, n, d, vocab int) error {
	const name = "embed"
	if n <= 0 || d <= 0 || vocab <= 0 || (dt == Q4K && d%256 != 0) || dt < F32 || dt > Q4K {
		return b.note(shapeErr(name, "%d tokens, d %d, vocab %d, %v", n, d, vocab, dt))
	}
	if err := need(name, "table", table, dt.Bytes(vocab*d)); err != nil {
		return b.note(err)
	}
	if err := need(name, "ids", ids, uint64(n*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "y", y, uint64(n*d*4)); err != nil {
		return b.note(err)
	}
	gx, gy := grid(ceilDiv(uint64(n*d), 256))
	p := Params{}.U32(uint32(n)).U32(uint32(d)).U32(uint32(dt)).U32(gx)
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, p, table, ids, y)
}

// Argmax records out[0] = the index (u32) of the largest of n values (the
// lowest index of it; NaNs skipped): blocks of 4096 values over many
// workgroups, then one workgroup over the blocks' winners.
func (k *Kernels) Argmax(ctx context.Context, b *Batch, x, out Region, n int) error {
	const name = "argmax"
	if n <= 0 {
		return b.note(shapeErr(name, "%d values", n))
	}
	if err := need(name, "x", x, uint64(n*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "out", out, 4); err != nil {
		return b.note(err)
	}
	blocks := (n + argmaxBlock - 1) / argmaxBlock
	if blocks == 1 {
		return k.run(ctx, b, "argmax_blocks", nil, [3]uint32{1, 1, 1}, Params{}.U32(uint32(n)).U32(uint32(n)).U32(2).U32(0), x, out)
	}
	part, err := b.temp(uint64(blocks * 8))
	if err != nil {
		return err
	}
	if err := k.run(ctx, b, "argmax_blocks", nil, [3]uint32{uint32(blocks), 1, 1}, Params{}.U32(uint32(n)).U32(argmaxBlock).U32(0).U32(0), x, part); err != nil {
		return err
	}
	return k.run(ctx, b, "argmax_blocks", nil, [3]uint32{1, 1, 1}, Params{}.U32(uint32(blocks)).U32(uint32(blocks)).U32(1).U32(0), part, out)
}

// argmaxBlock is the values one workgroup of Argmax's first pass takes:
// 16 per thread, so that a 152k vocabulary spreads over 38 workgroups.
const argmaxBlock = 4096

// TopP records out[0] = a token sampled from the top-p nucleus of
// softmax(logits/temperature) with the uniform draw u in [0, 1) (see
// ref.TopP for the exact rule). temperature <= 0 means greedy (Argmax).
func (k *Kernels) TopP(ctx context.Context, b *Batch, logits, out Region, n int, temperature, topP, u float32) error {
	const name = "topp"
	if temperature <= 0 {
		return k.Argmax(ctx, b, logits, out, n)
	}
	if n <= 0 || topP <= 0 || topP > 1 || u < 0 || u >= 1 {
		return b.note(shapeErr(name, "n %d, top-p %v, u %v (want 0 < top-p <= 1, 0 <= u < 1)", n, topP, u))
	}
	if err := need(name, "logits", logits, uint64(n*4)); err != nil {
		return b.note(err)
	}
	if err := need(name, "out", out, 4); err != nil {
		return b.note(err)
	}
	p := Params{}.U32(uint32(n)).F32(1 / temperature).F32(topP).F32(u)
	return k.run(ctx, b, name, nil, [3]uint32{1, 1, 1}, p, logits, out)
}

// KVStore records kc[pos] = src[kOff:kOff+n] and vc[pos] =
// src[vOff:vOff+n] (offsets and n in floats; kc and vc are [>pos][n]
// caches): a decode step's new cache row, with the caches bound whole so
// that the binding does not change with the position.
func (k *Kernels) KVStore(ctx context.Context, b *Batch, src, kc, vc Region, kOff, vOff, n, pos int) error {
	const name = "kv_store"
	if n <= 0 || kOff < 0 || vOff < 0 || pos < 0 || uint64(pos+1)*uint64(n) > math.MaxUint32 {
		return b.note(shapeErr(name, "rows of %d at position %d, from %d and %d", n, pos, kOff, vOff))
	}
	if err := need(name, "src", src, uint64(max(kOff, vOff)+n)*4); err != nil {
		return b.note(err)
	}
	for _, c := range []struct {
		what string
		r    Region
	}{{"k cache", kc}, {"v cache", vc}} {
		if err := need(name, c.what, c.r, uint64(pos+1)*uint64(n)*4); err != nil {
			return b.note(err)
		}
	}
	p := Params{}.U32(uint32(n)).U32(uint32(kOff)).U32(uint32(vOff)).U32(uint32(pos))
	return k.run(ctx, b, name, nil, [3]uint32{uint32(ceilDiv(uint64(n), 256)), 1, 1}, p, src, kc, vc)
}

// CopyKernel records dst = src with a compute shader (n bytes, a multiple
// of 16). Batch.Copy uses the copy engine instead; benchmarks measure both.
func (k *Kernels) CopyKernel(ctx context.Context, b *Batch, src, dst Region, n int) error {
	const name = "copy"
	if n <= 0 || n%16 != 0 {
		return b.note(shapeErr(name, "%d bytes (want a positive multiple of 16)", n))
	}
	if err := need(name, "src", src, uint64(n)); err != nil {
		return b.note(err)
	}
	if err := need(name, "dst", dst, uint64(n)); err != nil {
		return b.note(err)
	}
	const unroll = 4
	gx, gy := grid(ceilDiv(uint64(n/16), 256*unroll))
	return k.run(ctx, b, name, nil, [3]uint32{gx, gy, 1}, Params{}.U32(uint32(n/16)).U32(gx), src, dst)
}
