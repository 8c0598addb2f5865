package ops

import (
	"context"
	"encoding/binary"
	"math"
	"slices"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// FFN is a resident MoE layer's feed-forward for the router's choice in
// one dispatch (Q4KFFN): for each of the K experts in Sel, its gate and
// up products of X with SwiGLU's output quantized into Q, then its down
// product of that into Y. Entry e of the tables is expert Experts[e],
// its gate at Arena slot Gate[e], up at Up[e], down at Down[e] (equal
// slots: a Width x Hidden matrix has the bytes of a Hidden x Width one).
type FFN struct {
	Arena          gpu.Region
	Gate, Up, Down []int
	Experts        []int
	Sel            gpu.Region // K expert ids (u32, as Route writes them)
	K              int
	X              gpu.Region // the FFN norm's output quantized: XQBytes(Hidden)
	Q              gpu.Region // K activations quantized: K * XQBytes(Width)
	Y              gpu.Region // K down outputs: K * Hidden floats
	Counters       gpu.Region // FFNCounterBytes, zero at first (Alloc's are not); it sets the first three back, the fourth says a workgroup gave up waiting
	Hidden, Width  int
	// Apart records the two phases as two dispatches of the kernel, a
	// barrier between, so that no workgroup waits: what a CPU adapter
	// needs (lavapipe ends any loop after 65535 rounds, a wait among
	// them), and the same bits.
	Apart bool
}

// MaxFFNExperts is how many experts an FFN's tables hold, and maxFFNDim
// the largest hidden size and width it takes (a manifest's bound on
// intermediate_size).
const (
	MaxFFNExperts = 8
	maxFFNDim     = 1 << 22
)

// FFNCounterBytes is the size of an FFN's Counters: four u32, the tile
// counter, the gate and up tiles finished, the workgroups that left, and
// the give-up flag.
const FFNCounterBytes = 16

// ffnShapeOK reports whether hidden, width and k are within what the
// kernel's params and arithmetic hold, before anything is computed from
// them.
func ffnShapeOK(hidden, width, k int) bool {
	return hidden > 0 && width > 0 && hidden <= maxFFNDim && width <= maxFFNDim && hidden%256 == 0 && width%256 == 0 && k > 0 && k <= 32
}

// ffnConfigs are the configurations of an FFN's two phases: those of the
// masked gate and up products (with their output quantized) and of the
// masked down products for k of hidden x width, so that the fused
// dispatch sums every row as they do. ok is false where the kernel cannot
// take them (one workgroup size and rows a thread for both, gate and up
// handing their output over quantized).
func ffnConfigs(hidden, width, k int) (glu, down Q4KConfig, ok bool) {
	glu = groupConfig(width*k, hidden, true)
	down = groupConfig(hidden*k, width, true)
	ok = glu.Pipeline && down.Pipeline && glu.wg() == down.wg() && glu.Rows == down.Rows && glu.Rows == 8 && gluYQ(glu, width) &&
		checkQ4KConfig("q4k_ffn_xq", glu) == nil && checkQ4KConfig("q4k_ffn_xq", down) == nil
	return glu, down, ok
}

// CanFFN reports whether Q4KFFN takes a layer of this shape with k
// experts chosen.
func CanFFN(hidden, width, k int) bool {
	if !ffnShapeOK(hidden, width, k) {
		return false
	}
	_, _, ok := ffnConfigs(hidden, width, k)
	return ok
}

// FFNLaunch is the dispatch rule of Q4KFFN (it reads f's shape, not its
// regions). Bindings: weight arena, x, y, sel, quantized activations,
// counters.
func FFNLaunch(f FFN) (Launch, error) {
	l, _, err := ffnLaunch(f)
	return l, err
}

// ffnLaunch is FFNLaunch and the tiles an expert of each phase.
func ffnLaunch(f FFN) (Launch, [2]uint64, error) {
	const name = "q4k_ffn_xq"
	var none [2]uint64
	n := len(f.Experts)
	if !ffnShapeOK(f.Hidden, f.Width, f.K) || n == 0 || n > MaxFFNExperts || len(f.Gate) != n || len(f.Up) != n || len(f.Down) != n {
		return Launch{}, none, shapeErr(name, "%d experts (1..%d, a gate, up and down slot each), %d chosen (1..32), hidden %d and width %d (multiples of 256, at most %d)",
			n, MaxFFNExperts, f.K, f.Hidden, f.Width, maxFFNDim)
	}
	glu, down, ok := ffnConfigs(f.Hidden, f.Width, f.K)
	if !ok {
		return Launch{}, none, shapeErr(name, "hidden %d, width %d, %d chosen: the masked products' configurations (%+v, %+v) are not one workgroup size and 8 rows a thread", f.Hidden, f.Width, f.K, glu, down)
	}
	slotBytes := abi.Q4K.Bytes(f.Hidden * f.Width)
	maxSlot := 0
	for _, ss := range [][]int{f.Gate, f.Up, f.Down} {
		for _, s := range ss {
			if s < 0 {
				return Launch{}, none, shapeErr(name, "negative slot %d", s)
			}
			maxSlot = max(maxSlot, s)
		}
	}
	if uint64(maxSlot+1)*slotBytes/16 > math.MaxUint32 {
		return Launch{}, none, shapeErr(name, "slot %d is beyond 64 GiB", maxSlot)
	}
	for i, e := range f.Experts {
		if e < 0 || e >= MaskedUpper || slices.Contains(f.Experts[:i], e) {
			return Launch{}, none, shapeErr(name, "expert %d (each once, below 2^31)", e)
		}
	}
	// Tiles an expert: a workgroup's output rows of gate and up (half its
	// rows: a gate row and an up row make one), then of down.
	tiles1, tiles2 := ceilDiv(uint64(f.Width), glu.rowsPerWG()/2), ceilDiv(uint64(f.Hidden), down.rowsPerWG())
	total := uint64(f.K) * (tiles1 + tiles2)
	gx, gy := grid(total)
	params := gpu.Params{}.U32(uint32(f.Width)).U32(uint32(f.Hidden / 256)).U32(uint32(glu.SPR)).U32(uint32(tiles1)).
		U32(uint32(f.Hidden)).U32(uint32(f.Width / 256)).U32(uint32(down.SPR)).U32(uint32(tiles2)).
		U32(uint32(slotBytes / 16)).U32(uint32(f.K)).U32(uint32(n)).U32(uint32(XQBytes(f.Width) / 16)).
		U32(0).U32(0).U32(0).U32(0) // phase: both; Q4KFFN sets it with Apart
	for _, ss := range [][]int{f.Gate, f.Up, f.Down} {
		for i := range MaxFFNExperts {
			s := 0
			if i < n {
				s = ss[i]
			}
			params = params.U32(uint32(s))
		}
	}
	for i := range MaxFFNExperts {
		e := 0
		if i < n {
			e = f.Experts[i]
		}
		params = params.U32(uint32(e))
	}
	return Launch{Kernel: name, Constants: map[string]float64{"ROWS": float64(glu.Rows), "WG": float64(glu.wg())},
		Groups: [3]uint32{gx, gy, 1}, Params: params,
		Bindings: []Binding{{"weight arena", uint64(maxSlot+1) * slotBytes}, {"x", XQBytes(f.Hidden)}, {"y", uint64(f.K * f.Hidden * 4)},
			{"sel", uint64(f.K * 4)}, {"quantized activations", uint64(f.K) * XQBytes(f.Width)}, {"counters", FFNCounterBytes}}}, [2]uint64{tiles1, tiles2}, nil
}

// Q4KFFN records f: the same bits as Q4KMatVecMasked of the gate and up
// (UpSlots, XQ, YQ into f.Q) and then of the down products of f.Q into
// f.Y, with no barrier between them. Its workgroups take tiles from an
// atomic counter in f.Counters, every gate and up tile before any down
// tile; a down tile's first weights are asked for before its workgroup
// waits for the gate and up tiles to finish (which only running
// workgroups hold, so the wait ends whatever the grid), and the last
// workgroup to leave sets the counters back to zero. Every expert the
// router can choose must be in the tables: a choice that is not leaves
// its rows of f.Q and f.Y as they were. Give each FFN of a batch
// counters of its own or let wgpu order them (the same buffer, read and
// written: a barrier between).
func (k *Kernels) Q4KFFN(ctx context.Context, b *gpu.Batch, f FFN) error {
	l, tiles, err := ffnLaunch(f)
	if err != nil || !f.Apart {
		return k.launch(ctx, b, l, err, f.Arena, f.X, f.Y, f.Sel, f.Q, f.Counters)
	}
	for phase := uint32(1); phase <= 2; phase++ {
		lp := l
		lp.Params = slices.Clone(l.Params)
		binary.LittleEndian.PutUint32(lp.Params[ffnPhaseAt:], phase)
		gx, gy := grid(uint64(f.K) * tiles[phase-1]) // a workgroup a tile of this phase
		lp.Groups = [3]uint32{gx, gy, 1}
		if err := k.launch(ctx, b, lp, nil, f.Arena, f.X, f.Y, f.Sel, f.Q, f.Counters); err != nil {
			return err
		}
	}
	return nil
}

// ffnPhaseAt is the byte of the params that says which phases a dispatch
// runs: 0 both, 1 or 2 that one.
const ffnPhaseAt = 48
