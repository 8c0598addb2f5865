package ops

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// BenchmarkQ4KDecode times the Q4_K products of one Mixtral-8x7B decode
// step as the step runs them: each dispatch waits for the one before it
// (a decode step is a chain: every product reads what the previous
// dispatch wrote), so the ratio is x-of-copy-serial against the copy
// bandwidth measured in the same run. Shapes: the layer's stacked q, k
// and v (6144x4096), o (4096x4096), the masked gate and up products of 8
// experts with the router's 2 chosen (16 products of 14336x4096 in one
// dispatch, 4 of them run) and the masked down products straight from
// SwiGLU of those (8 of 4096x14336, 2 run), the LM head (32000x4096,
// of float and of quantized x). Each also as x-of-same-copy (see report).
//
// Attention follows, at three cache lengths and three chunk sizes, then
// the flavor the step runs (attention_rope: RoPE and the new rows in the
// split, quantized output) at the same lengths.
// RDRR_BENCH_SWEEP=1 also times every configuration of the Q4_K kernel at
// each shape (what DefaultQ4KConfig was chosen from for decode), with
// 1, 2, 4 and 8 rows a thread, or the list in RDRR_BENCH_SWEEP_ROWS
// ("6,8,12": at most 16, even for the gate and up products).
func BenchmarkQ4KDecode(b *testing.B) {
	m := newMeter(b)
	var copyBW float64
	b.Run("copy", func(b *testing.B) {
		copyBW = m.copyBandwidth(b).best()
		b.ReportMetric(copyBW/1e9, "GB/s")
	})
	if copyBW == 0 {
		copyBW = m.copyBandwidth(b).best()
	}
	// x-of-same-copy compares a dispatch with a copy kernel that moves as
	// many bytes (half read, half written), one copy after another as the
	// products run: a copy of 256 MiB (copyBW) hides the fixed cost of a
	// dispatch (its launch, the loads' first latency, the tail) that a
	// product of 9-132 MB pays, and a decode step pays for each.
	sameCopy := map[uint64]time.Duration{}
	report := func(b *testing.B, bytes float64, per time.Duration) {
		b.ReportMetric(bytes/per.Seconds()/copyBW, "x-of-copy-serial")
		b.ReportMetric(float64(per.Nanoseconds())/1e3, "us/dispatch")
		n := uint64(bytes/2) / 16 * 16
		if _, ok := sameCopy[n]; !ok {
			sameCopy[n] = m.copySerial(b, n)
		}
		b.ReportMetric(float64(sameCopy[n])/float64(per), "x-of-same-copy")
	}
	type shape struct {
		name       string
		rows, cols int
		experts    int        // 0: one plain product; else masked, 8 experts
		form       maskedForm // what the masked products read and write
		xq         bool       // x quantized (QuantizeX), the _xq kernels
	}
	// gate_up and down (down computing SwiGLU of its x itself) keep the
	// names of earlier measurements; glu and down_act are what a decode
	// step runs by default.
	shapes := []shape{
		{"qkv", 6144, 4096, 0, 0, false},
		{"qkv_xq", 6144, 4096, 0, 0, true},
		{"o", 4096, 4096, 0, 0, false},
		{"o_xq", 4096, 4096, 0, 0, true},
		{"gate_up", 14336, 4096, 8, maskedGateUp, false},
		{"glu", 14336, 4096, 8, maskedGLU, false},
		{"glu_xq", 14336, 4096, 8, maskedGLU, true},
		{"down", 4096, 14336, 8, maskedDownSwiGLU, false},
		{"down_act", 4096, 14336, 8, maskedDown, false},
		{"down_act_xq", 4096, 14336, 8, maskedDown, true},
		{"head", 32000, 4096, 0, 0, false},
		{"head_xq", 32000, 4096, 0, 0, true},
	}
	if m.cpu { // lavapipe: one small shape of each kind
		shapes = []shape{{"qkv", 768, 512, 0, 0, false}, {"qkv_xq", 768, 512, 0, 0, true}, {"gate_up", 512, 512, 4, maskedGateUp, false}, {"glu", 512, 512, 4, maskedGLU, false},
			{"glu_xq", 512, 512, 4, maskedGLU, true}, {"down", 512, 512, 4, maskedDownSwiGLU, false}, {"down_act", 512, 512, 4, maskedDown, false}}
	}
	if !m.cpu {
		// A resident MoE layer's gate, up and down products of 8
		// experts, 2 chosen: the two masked dispatches a step runs
		// (glu_xq then down_act_xq, over the same arenas), and the one
		// of Q4KFFN that replaces them, each pair or dispatch after the
		// one before. ffn-of-two is the fused dispatch's time over the
		// pair's.
		var two time.Duration
		b.Run("ffn_two_xq/14336x4096", func(b *testing.B) {
			bytes, per := m.ffnSerial(b, 4096, 14336, 8, 2, true)
			two = per
			report(b, bytes, per)
		})
		b.Run("ffn_xq/14336x4096", func(b *testing.B) {
			bytes, per := m.ffnSerial(b, 4096, 14336, 8, 2, false)
			report(b, bytes, per)
			if two > 0 {
				b.ReportMetric(float64(per)/float64(two), "ffn-of-two")
			}
		})
		// What the mask costs: the 4 gate and up products the router
		// chose as a plain group (no products that return at once).
		b.Run("gate_up_group4/14336x4096", func(b *testing.B) {
			r := m.q4kGroup(b, 14336, 4096, 4, true, DefaultQ4KConfig(4*14336, 4096, 1))
			b.ReportMetric(r.serial/copyBW, "x-of-copy-serial")
			b.ReportMetric(float64(4*abi.Q4K.Bytes(14336*4096))/r.serial*1e6, "us/dispatch")
		})
	}
	// Attention (split and merge) at the positions of a short, a medium
	// and a long decode, in chunks of 16, 32 and 64 positions (* marks
	// attnChunk, the rule's).
	if !m.cpu {
		for _, kvLen := range []int{200, 1000, 4096} {
			for _, ch := range []int{16, 32, 64} {
				mark := ""
				if ch == attnChunk {
					mark = "*"
				}
				b.Run(fmt.Sprintf("attention/%d/ch%d%s", kvLen, ch, mark), func(b *testing.B) {
					defer func(c int) { attnChunk = c }(attnChunk)
					attnChunk = ch
					r := m.attention(b, 32, 8, 128, kvLen)
					b.ReportMetric(r.bw/copyBW, "x-of-copy")
					b.ReportMetric(float64(r.per.Nanoseconds())/1e3, "us/dispatch")
				})
			}
		}
	}
	// The flavor the decode step runs (RoPE and the new rows in the
	// split, quantized output), in the rule's chunks.
	if !m.cpu {
		for _, kvLen := range []int{200, 600, 1000, 4096} {
			b.Run(fmt.Sprintf("attention_rope/%d", kvLen), func(b *testing.B) {
				r := m.ropeAttention(b, 32, 8, 128, kvLen)
				b.ReportMetric(r.bw/copyBW, "x-of-copy")
				b.ReportMetric(float64(r.per.Nanoseconds())/1e3, "us/dispatch")
			})
		}
	}
	// A decode step's norm: one row, one workgroup, latency-bound.
	b.Run("rmsnorm/1x4096", func(b *testing.B) {
		r := m.rows(b, "rmsnorm", 1, 4096)
		b.ReportMetric(float64(r.per.Nanoseconds())/1e3, "us/dispatch")
	})
	sweep := os.Getenv("RDRR_BENCH_SWEEP") == "1"
	for _, s := range shapes {
		const kSel = 2
		time1 := func(b *testing.B, cfg *Q4KConfig) {
			var bytes float64
			var per time.Duration
			if s.experts == 0 {
				bytes, per = m.q4kSerial(b, s.rows, s.cols, s.xq, cfg)
			} else {
				bytes, per = m.q4kMaskedSerial(b, s.rows, s.cols, s.experts, kSel, s.form, s.xq, cfg)
			}
			report(b, bytes, per)
		}
		b.Run(fmt.Sprintf("%s/%dx%d", s.name, s.rows, s.cols), func(b *testing.B) { time1(b, nil) })
		if !sweep {
			continue
		}
		rows := []int{1, 2, 4, 8}
		if v := os.Getenv("RDRR_BENCH_SWEEP_ROWS"); v != "" { // e.g. "6,10,12,16"
			rows = nil
			for _, f := range strings.Split(v, ",") {
				if n, err := strconv.Atoi(f); err == nil && n > 0 && n <= 16 {
					rows = append(rows, n)
				}
			}
		}
		for _, wg := range []int{64, 128, 256} {
			for spr := 1; spr <= wg/8 && spr <= 32; spr *= 2 {
				for _, rw := range rows {
					cfg := Q4KConfig{WG: wg, SPR: spr, Rows: rw, Pipeline: true}
					if uint64(spr) > uint64(s.cols/256) || rw*wg > 4096 || (s.form == maskedGLU && rw%2 != 0) {
						continue
					}
					b.Run(fmt.Sprintf("%s_sweep/%dx%d/wg%d-spr%d-rows%d", s.name, s.rows, s.cols, wg, spr, rw), func(b *testing.B) { time1(b, &cfg) })
				}
			}
		}
	}
}

// q4kSerial times a rows x cols product (cfg nil: the default
// configuration) one dispatch after another; it returns the bytes one
// dispatch must move and its time.
func (m *meter) q4kSerial(b *testing.B, rows, cols int, xq bool, cfg *Q4KConfig) (float64, time.Duration) {
	ctx := context.Background()
	wBytes := abi.Q4K.Bytes(rows * cols)
	ws := m.q4kWeights(b, rows, cols)
	nw := len(ws)
	x, y := m.alloc(b, uint64(cols*4)), m.alloc(b, uint64(rows*4))
	m.fill(b, x, uint64(cols*4))
	c := DefaultQ4KConfig(rows, cols, 1)
	if cfg != nil {
		c = *cfg
	}
	s := MatShape{Rows: rows, Cols: cols, Tokens: 1}
	if xq {
		q := m.quantized(b, x, cols)
		per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
			return m.k.Q4KMatVecXQWith(ctx, bt, c, ws[i%nw], q, y, rows, cols)
		})
		return float64(wBytes) + float64(XQBytes(cols)) + float64(rows*4), per
	}
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return m.k.Q4KMatMulWith(ctx, bt, c, ws[i%nw], x, y, s)
	})
	return float64(wBytes) + float64(cols*4) + float64(rows*4), per
}

// maskedForm is what a benchmarked masked dispatch computes.
type maskedForm int

const (
	maskedGateUp     maskedForm = iota + 1 // gate and up products, each into its half of y
	maskedGLU                              // gate and up in one workgroup, silu(gate) * up into y
	maskedDownSwiGLU                       // down products computing SwiGLU of gate and up rows themselves
	maskedDown                             // down products of SwiGLU's output
)

// q4kMaskedSerial times one MoE layer's masked expert products as
// Q4KMatVecMasked records them (cfg nil: its default configuration), one
// dispatch after another: experts experts, kSel of them chosen, in form
// f (gate and up products read one shared x, rows x cols each; down
// products read their expert's x). Weights alternate between two arenas
// so that a dispatch never reads what the previous one left in the L2
// (RDRR_BENCH_ARENAS=N: N arenas, as a step's 32 layers' experts spread
// over many gigabytes; what memory first touched costs).
func (m *meter) q4kMaskedSerial(b *testing.B, rows, cols, experts, kSel int, f maskedForm, xq bool, cfg *Q4KConfig) (float64, time.Duration) {
	ctx := context.Background()
	wBytes := abi.Q4K.Bytes(rows * cols)
	gateUp := f == maskedGateUp || f == maskedGLU
	products := experts
	if gateUp {
		products = 2 * experts
	}
	if uint64(products)*wBytes > m.d.Limits().MaxStorageBufferBindingSize {
		b.Skipf("%d products of %d bytes pass the storage binding limit", products, wBytes)
	}
	blocks := benchQ4K(rows * cols / 256)
	arenas := make([]*gpu.Buffer, 2)
	if n, err := strconv.Atoi(os.Getenv("RDRR_BENCH_ARENAS")); err == nil && n >= 2 && n <= 64 {
		arenas = make([]*gpu.Buffer, n)
	}
	for i := range arenas {
		arenas[i] = m.alloc(b, uint64(products)*wBytes)
		for s := range products {
			if err := m.d.Upload(ctx, arenas[i].Sub(uint64(s)*wBytes, wBytes), blocks); err != nil {
				b.Fatal(err)
			}
		}
	}
	slots, ids := make([]int, products), make([]int, products)
	for e := range products {
		slots[e], ids[e] = e, e
		if gateUp {
			ids[e] = e / 2
			if e%2 == 1 {
				ids[e] |= MaskedUpper
			}
		}
	}
	sel := m.alloc(b, uint64(kSel*4))
	chosen := make([]uint32, kSel)
	for j := range chosen {
		chosen[j] = uint32((3 + 5*j) % experts) // spread over the arena
	}
	if err := m.d.Write(sel, gpu.Bytes(chosen)); err != nil {
		b.Fatal(err)
	}
	g := groupCall{slots: slots, experts: ids, kSel: kSel, xUpper: -1, rows: rows, cols: cols}
	nx := kSel * 2 // SwiGLU's gate and up rows
	ySize := uint64(2 * kSel * rows * 4)
	switch f {
	case maskedGateUp:
		g.sharedX, g.yUpper, nx = true, kSel*rows*4, 1
	case maskedGLU:
		// Expert e's gate at slot 2e, its up at 2e+1, as above.
		g.slots, g.upSlots, g.experts = nil, nil, nil
		for e := range experts {
			g.slots, g.upSlots, g.experts = append(g.slots, 2*e), append(g.upSlots, 2*e+1), append(g.experts, e)
		}
		g.sharedX, nx, ySize = true, 1, uint64(kSel*rows*4)
	case maskedDownSwiGLU:
		g.xUpper = kSel * cols * 4
	case maskedDown:
		nx, ySize = kSel, uint64(kSel*rows*4)
	}
	x, y := m.alloc(b, uint64(nx*cols*4)), m.alloc(b, ySize)
	m.fill(b, x, uint64(nx*cols*4))
	xBytes := uint64(nx * cols * 4)
	if xq {
		x, xBytes, g.xq = m.quantized(b, x, nx*cols), uint64(nx)*XQBytes(cols), true
	}
	c := groupConfig(rows*kSel, cols, g.xq)
	if cfg != nil {
		c = *cfg
	}
	l, err := groupLaunch(c, g)
	if err != nil {
		b.Fatal(err)
	}
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return m.k.launch(ctx, bt, l, nil, arenas[i%len(arenas)], x, y, sel)
	})
	run := kSel
	if gateUp {
		run = 2 * kSel
	}
	return float64(run)*float64(wBytes) + float64(xBytes) + float64(ySize), per
}

// ffnSerial times a resident MoE layer's feed-forward for kSel of
// experts chosen, dispatch after dispatch over rotated arenas (expert
// e's gate, up and down at slots 3e, 3e+1, 3e+2): with two true the
// masked gate and up products (their output quantized) and the masked
// down products, two dispatches; else Q4KFFN. It returns the weight
// bytes a step reads and the time of one.
func (m *meter) ffnSerial(b *testing.B, hidden, width, experts, kSel int, two bool) (float64, time.Duration) {
	ctx := context.Background()
	wBytes := abi.Q4K.Bytes(hidden * width)
	if uint64(3*experts)*wBytes > m.d.Limits().MaxStorageBufferBindingSize {
		b.Skipf("%d matrices of %d bytes pass the storage binding limit", 3*experts, wBytes)
	}
	blocks := benchQ4K(hidden * width / 256)
	arenas := make([]*gpu.Buffer, 2)
	for i := range arenas {
		arenas[i] = m.alloc(b, uint64(3*experts)*wBytes)
		for s := range 3 * experts {
			if err := m.d.Upload(ctx, arenas[i].Sub(uint64(s)*wBytes, wBytes), blocks); err != nil {
				b.Fatal(err)
			}
		}
	}
	gate, up, down, ids := make([]int, experts), make([]int, experts), make([]int, experts), make([]int, experts)
	for e := range experts {
		gate[e], up[e], down[e], ids[e] = 3*e, 3*e+1, 3*e+2, e
	}
	sel := m.alloc(b, uint64(kSel*4))
	chosen := make([]uint32, kSel)
	for j := range chosen {
		chosen[j] = uint32((3 + 5*j) % experts)
	}
	if err := m.d.Write(sel, gpu.Bytes(chosen)); err != nil {
		b.Fatal(err)
	}
	x := m.alloc(b, uint64(hidden*4))
	m.fill(b, x, uint64(hidden*4))
	xq := m.quantized(b, x, hidden)
	q, act, y := m.alloc(b, uint64(kSel)*XQBytes(width)), m.alloc(b, uint64(kSel*width*4)), m.alloc(b, uint64(kSel*hidden*4))
	ctr := m.alloc(b, FFNCounterBytes)
	if err := m.d.Write(ctr, make([]byte, FFNCounterBytes)); err != nil {
		b.Fatal(err)
	}
	per := m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		a := arenas[i%len(arenas)]
		if two {
			if err := m.k.Q4KMatVecMasked(ctx, bt, Masked{Arena: a, Slots: gate, UpSlots: up, Experts: ids, Sel: sel, K: kSel,
				X: xq, SharedX: true, Y: act, Rows: width, Cols: hidden, XQ: true, YQ: q}); err != nil {
				return err
			}
			return m.k.Q4KMatVecMasked(ctx, bt, Masked{Arena: a, Slots: down, Experts: ids, Sel: sel, K: kSel,
				X: q, Y: y, Rows: hidden, Cols: width, XQ: true})
		}
		return m.k.Q4KFFN(ctx, bt, FFN{Arena: a, Gate: gate, Up: up, Down: down, Experts: ids, Sel: sel, K: kSel, X: xq, Q: q, Y: y,
			Counters: ctr, Hidden: hidden, Width: width})
	})
	if got := make([]uint32, 4); !two && (m.d.Read(ctx, ctr, gpu.Bytes(got)) != nil || !slices.Equal(got, []uint32{0, 0, 0, 0})) {
		b.Fatalf("counters %v after the dispatches: a workgroup gave up waiting, or they were not set back", got)
	}
	return float64(3*kSel) * float64(wBytes), per
}

// quantized returns n values of x quantized (QuantizeX), as a decode step
// hands them to the _xq products.
func (m *meter) quantized(b *testing.B, x *gpu.Buffer, n int) *gpu.Buffer {
	q := m.alloc(b, XQBytes(n))
	bt := m.d.Batch()
	if err := m.k.QuantizeX(context.Background(), bt, x, q, n); err != nil {
		b.Fatal(err)
	}
	if err := bt.Submit(context.Background()); err != nil {
		b.Fatal(err)
	}
	return q
}

// copySerial times copies of n bytes (compute-shader copies), one
// dispatch after another, over buffers that rotate beyond the L2.
func (m *meter) copySerial(b *testing.B, n uint64) time.Duration {
	nr := m.rotation(2 * n)
	src, dst := make([]*gpu.Buffer, nr), make([]*gpu.Buffer, nr)
	for i := range src {
		src[i], dst[i] = m.alloc(b, n), m.alloc(b, n)
		m.fill(b, src[i], n)
	}
	return m.timeDispatches(b, func(bt *gpu.Batch, i int) error {
		return m.k.CopyKernel(context.Background(), bt, src[i%nr], dst[i%nr], int(n))
	})
}
