package lab

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/gpu/ref"
)

// Harnesses of the ops whose answer is discrete: route_topk (expert ids,
// and their weights) and topp (one sampled token). Ids and tokens are
// checked exactly, ties resolved as the built-ins document (the lower
// index wins; top-p keeps tied probabilities together). Inputs hold exact
// ties on purpose, and are drawn again where a near-tie (within what
// float32 can decide) would make the float64 reference's answer a matter
// of rounding.

func init() {
	harnesses["route_topk"] = harness{
		// tokens, experts, k
		gateShapes: [][]int{{1, 1, 1}, {3, 8, 2}, {1, 64, 6}, {2, 1000, 5}, {5, 160, 6}, {2, 999, 7}, {4, 256, 8}, {1, 1024, 32}, {300, 8, 2}},
		random: func(r *rand.Rand) []int {
			e := 1 + r.IntN(1024)
			return []int{1 + r.IntN(8), e, 1 + r.IntN(min(32, e))}
		},
		make:  makeRoute,
		shape: []int{1, 8, 2},
	}
	harnesses["topp"] = harness{
		// n
		gateShapes: [][]int{{1}, {2}, {7}, {255}, {257}, {1000}, {32000}, {151936}},
		random:     func(r *rand.Rand) []int { return []int{1 + r.IntN(50000)} },
		make:       makeTopP,
		shape:      []int{32000},
	}
}

// routeConfig is the routing a route_topk shape runs: Mixtral's (softmax
// over the top-k logits) up to 64 experts; DeepSeek-V3's (sigmoid scores
// with a selection bias, 8 groups of which the best 4 are kept, routed
// scale 2.5) for more experts in 8 groups; sigmoid with a bias and no
// groups otherwise.
func routeConfig(experts, k int) ref.Route {
	switch {
	case experts <= 64:
		return ref.Route{Mode: abi.RouteSoftmaxTopK, K: k}
	case experts%8 == 0 && k <= 4*(experts/8):
		return ref.Route{Mode: abi.RouteSigmoidTopK, K: k, Groups: 8, TopKGroup: 4, Scale: 2.5}
	}
	return ref.Route{Mode: abi.RouteSigmoidTopK, K: k, Scale: 1}
}

// makeRoute: ids ([tokens][k] u32) and weights of the top-k experts per
// token. Two experts share their bias, and in half the tokens their logit
// too (in half of those above all others): an exact tie that the lower
// index must win. A token whose choice changes when the logits (softmax)
// or the biases (sigmoid) move by 1e-5 is drawn again. Without a bias the
// bias binding holds NaNs (the runtime binds another buffer there, unread).
//
// Not covered: more than 65535 tokens (the grid's second dimension), which
// takes lavapipe seconds a dispatch.
func makeRoute(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 3 {
		return nil, fmt.Errorf("lab: route_topk takes tokens, experts, k")
	}
	tokens, experts, k := dims[0], dims[1], dims[2]
	if tokens < 1 || experts < 1 || experts > 1024 || k < 1 || k > 32 || k > experts {
		return nil, fmt.Errorf("lab: route_topk %v (experts <= 1024, k <= 32 and <= experts)", dims)
	}
	if _, err := elems([]int{tokens, experts}); err != nil {
		return nil, err
	}
	rt := routeConfig(experts, k)
	sigmoid := rt.Mode == abi.RouteSigmoidTopK
	ti, tj := 0, 0
	if experts > 1 {
		ti = r.IntN(experts)
		tj = (ti + 1 + r.IntN(experts-1)) % experts
	}
	bias := make([]float32, experts)
	jitter := make([]float64, experts)
	for e := range experts {
		jitter[e] = (2*r.Float64() - 1) * 1e-5
		bias[e] = float32(math.NaN())
		if sigmoid {
			bias[e] = float32(r.NormFloat64() * 0.1)
		}
	}
	bias[tj], jitter[tj] = bias[ti], jitter[ti]
	if sigmoid {
		rt.Bias = ref.F32(bias)
	}
	// decided reports whether the token's choice stays when the values
	// that select move by the jitter, either way.
	decided := func(row []float64) bool {
		ids, _ := ref.TopK(row, 1, experts, rt)
		for _, sign := range []float64{1, -1} {
			jr, jt := slices.Clone(row), rt
			if sigmoid {
				jt.Bias = slices.Clone(rt.Bias)
				for e := range jt.Bias {
					jt.Bias[e] += sign * jitter[e]
				}
			} else {
				for e := range jr {
					jr[e] += sign * jitter[e]
				}
			}
			if got, _ := ref.TopK(jr, 1, experts, jt); !slices.Equal(got, ids) {
				return false
			}
		}
		return true
	}
	logits := make([]float32, 0, tokens*experts)
	for range tokens {
		var row []float32
		for try := 0; ; try++ {
			if try == 100 {
				return nil, fmt.Errorf("lab: route_topk %v: no decided token in %d draws", dims, try)
			}
			row = normal(r, experts, 2)
			if experts > 1 && r.IntN(2) == 0 {
				row[tj] = row[ti]
				if r.IntN(2) == 0 {
					row[ti] = slices.Max(row) + 0.5
					row[tj] = row[ti]
				}
			}
			if decided(ref.F32(row)) {
				break
			}
		}
		logits = append(logits, row...)
	}
	wantIDs, wantW := ref.TopK(ref.F32(logits), tokens, experts, rt)
	biasBytes := int64(0)
	if sigmoid {
		biasBytes = int64(experts) * 4
	}
	l, err := ops.RouteLaunch(ops.RouteShape{Tokens: tokens, Experts: experts, K: k, Mode: rt.Mode,
		Groups: rt.Groups, TopKGroup: rt.TopKGroup, Scale: float32(rt.Scale)}, sigmoid)
	return dispatched("route_topk", &problem{
		binds: []binding{{data: gpu.Bytes(logits), size: tokens * experts * 4}, {data: gpu.Bytes(bias), size: experts * 4},
			{size: tokens * k * 4}, {size: tokens * k * 4}},
		bytes: int64(tokens*experts)*4 + biasBytes + int64(2*tokens*k)*4,
		check: func(out map[int][]byte) (float64, error) {
			for i, want := range wantIDs {
				if got := binary.LittleEndian.Uint32(out[2][4*i:]); int64(got) != int64(want) {
					return math.MaxFloat64, fmt.Errorf("%w: token %d choice %d: expert %d; want %d", ref.ErrMismatch, i/k, i%k, got, want)
				}
			}
			return worst(f32s(out[3]), wantW, ref.Tolerance(ref.OpRoute))
		},
	}, l, err)
}

// toppMargin is the least probability mass between a top-p decision
// (the nucleus's edge, u's target) and its flipping that the gate asks of
// its inputs (gpu/ops's TestTopP asks the same): well above float32's error
// on sums of up to 2^18 probabilities.
const toppMargin = 1e-4

// makeTopP: one token sampled from the top-p nucleus of softmax(logits /
// temperature) with a fixed u (the uniform block holds it). Temperature
// and top-p vary by problem, the logits are a head of up to 64 tokens
// over a bulk (as a language model's are), the largest logit is tied and
// so are a few others (top-p keeps tied probabilities together). u, then
// the logits, are drawn again until the reference's decision has
// toppMargin.
func makeTopP(r *rand.Rand, dims []int) (*problem, error) {
	if len(dims) != 1 {
		return nil, fmt.Errorf("lab: topp takes n")
	}
	n, err := elems(dims)
	if err != nil {
		return nil, err
	}
	temp := float32([]float64{0.6, 0.8, 1, 1.3}[r.IntN(4)])
	invT := 1 / temp // what the dispatch rule puts in the uniform block
	topP := float32([]float64{0.5, 0.8, 0.9, 0.95}[r.IntN(4)])
	var x []float32
	var u float32
	want := -1
	for try := 0; want < 0; try++ {
		if try == 50 {
			return nil, fmt.Errorf("lab: topp %v: no input with a safe margin in %d draws", dims, try)
		}
		// A bulk of small logits and a head of up to 64 large ones at
		// random places, which holds all but about 1% of the mass at every
		// temperature here: the nucleus lies in the head, where float32
		// can place its edges (in a flat distribution of 10^5 tokens no
		// decision has the margin).
		x = normal(r, n, 1)
		head := r.Perm(n)[:1+r.IntN(min(n, 64))]
		lift := 1.3 * (math.Log(float64(n)) + 6)
		for _, i := range head {
			x[i] = float32(lift + 1.5*r.NormFloat64())
		}
		if n > 2 {
			// Ties: the largest twice, two of the head, a few others.
			m := slices.Max(x)
			x[r.IntN(n)] = m
			x[head[r.IntN(len(head))]] = x[head[0]]
			for range min(n/50, 5) {
				x[r.IntN(n)] = x[r.IntN(n)]
			}
		}
		x64 := ref.F32(x)
		for range 5 { // then the nucleus's edge may be what is too close
			u = float32(r.Float64() * 0.999)
			tok, margin := ref.TopP(x64, 1/float64(invT), float64(topP), float64(u))
			if n == 1 || margin >= toppMargin {
				want = tok
				break
			}
		}
	}
	// The runtime's form (ops.TopPLaunches): five dispatches of topp_blocks
	// over the logits, a scratch binding and the token; a variant replaces
	// all five.
	ls, scratch, err := ops.TopPLaunches(ops.TopPShape{N: n, Temperature: temp, TopP: topP, U: u})
	if err != nil {
		return nil, fmt.Errorf("lab: topp: %w", err)
	}
	binds := make([][]int, len(ls))
	for i := range binds {
		binds[i] = []int{0, 2, 1}
	}
	return sequenced("topp", &problem{
		binds: []binding{{data: gpu.Bytes(x), size: n * 4}, {size: 4}, {size: int(scratch)}},
		bytes: int64(n)*4 + 4,
		check: func(out map[int][]byte) (float64, error) {
			if got := binary.LittleEndian.Uint32(out[1]); int64(got) != int64(want) {
				return math.MaxFloat64, fmt.Errorf("%w: token %d; want %d", ref.ErrMismatch, got, want)
			}
			return 0, nil
		},
	}, ls, binds)
}
