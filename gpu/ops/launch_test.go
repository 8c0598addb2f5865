package ops

import (
	"errors"
	"testing"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
)

// Every dispatch rule fits the ABI of the kernel it names: one Binding
// per storage binding, a uniform block no larger than the kernel's, a
// grid of 1..65535 workgroups each way, and constants the kernel declares
// (it compiles with them). A variant is compiled with the kernel's ABI
// and run by these rules (by the runtime and by the kernel lab), so a rule
// that drifts from its WGSL would run every variant wrong.
func TestLaunchesMatchABI(t *testing.T) {
	group := Group{Slots: []int{2, 0, 1}, Rows: 300, Cols: 512}
	masked := Masked{Slots: []int{0, 1}, Experts: []int{3, 5 | MaskedUpper}, K: 2, YUpper: 64, Rows: 40, Cols: 256}
	cases := []struct {
		name string
		l    Launch
		err  error
	}{}
	add := func(name string, l Launch, err error) {
		cases = append(cases, struct {
			name string
			l    Launch
			err  error
		}{name, l, err})
	}
	for _, s := range []MatShape{{1, 256, 1}, {4096, 4096, 1}, {300, 2304, 5}, {7168, 2048, 1}} {
		l, err := Q4KLaunch(DefaultQ4KConfig(s.Rows, s.Cols, s.Tokens), s, false)
		add("q4k", l, err)
	}
	l, err := Q4KLaunch(Q4KConfig{SPR: 4, Rows: 4, Coalesced: true}, MatShape{4096, 4096, 1}, false)
	add("q4k coalesced", l, err)
	l, err = Q4KLaunch(DefaultQ4KConfig(64, 512, 1), MatShape{64, 512, 1}, true)
	add("q4k add", l, err)
	l, err = GroupLaunch(DefaultQ4KConfig(900, 512, 1), group)
	add("group", l, err)
	l, err = maskedLaunch(masked.call())
	add("masked", l, err)
	// A norm handed over: any region as the partial sums (the rules read
	// only that there is one).
	n := Normed{Parts: new(gpu.Buffer), Eps: 1e-5}
	l, err = Q4KPartLaunch(DefaultQ4KConfig(6144, 4096, 1), 6144, 4096, n)
	add("q4k part", l, err)
	normed := masked
	normed.SharedX, normed.Normed = true, n
	l, err = maskedLaunch(normed.call())
	if l.Kernel != "q4k_matmul_masked_part" {
		t.Errorf("masked with a norm handed over: kernel %q", l.Kernel)
	}
	add("masked part", l, err)
	l, err = DensePartLaunch(8, 4096, n)
	add("dense part", l, err)
	l, err = AccumulateNormLaunch(AccumShape{Experts: 2, Dim: 4096})
	add("accumulate norm", l, err)
	// A norm of more values than the kernels sum partial sums for is
	// refused; the partial sums bound are those of the product's columns.
	if _, err := Q4KPartLaunch(DefaultQ4KConfig(6144, 4096, 1), 6144, 256*(MaxParts+1), n); err == nil {
		t.Errorf("q4k part: %d partial sums accepted", MaxParts+1)
	}
	if l, err := Q4KPartLaunch(DefaultQ4KConfig(6144, 2048, 1), 6144, 2048, n); err != nil || l.Bindings[3].Bytes != 8*4 {
		t.Errorf("q4k part of 2048 columns: partial sums binding %v (%v); want 8 of them", l.Bindings, err)
	}
	if _, err := DensePartLaunch(8, 4096*5, n); err == nil {
		t.Error("dense part: 80 partial sums accepted")
	}
	if _, err := AccumulateNormLaunch(AccumShape{Experts: 1, Dim: 256*MaxParts + 1}); err == nil {
		t.Errorf("accumulate norm: %d partial sums accepted", MaxParts+1)
	}
	l, err = Q4KDequantLaunch(abi.F16, 512)
	add("dequant", l, err)
	l, err = DenseLaunch(abi.F16, MatShape{9, 1024, 8})
	add("dense", l, err)
	l, err = RMSNormLaunch(NormShape{Rows: 3, Dim: 100, Eps: 1e-5})
	add("rmsnorm", l, err)
	l, err = SoftmaxLaunch(RowsShape{Rows: 3, Dim: 100})
	add("softmax", l, err)
	l, err = SwiGLULaunch(70000 * 256)
	add("swiglu", l, err)
	l, err = AccumulateLaunch(AccumShape{Experts: 2, Dim: 4096, WeightOff: 2})
	add("accumulate", l, err)
	l, err = EmbedLaunch(EmbedShape{Type: abi.Q4K, Tokens: 2, Dim: 512, Vocab: 10})
	add("embed", l, err)
	l, err = CopyLaunch(1 << 20)
	add("copy", l, err)
	for _, n := range []uint64{100, 128 << 10, 64 << 20} {
		l, err = L2PrefetchLaunch(n)
		add("l2_prefetch", l, err)
	}
	l, err = RopeLaunch(RopeShape{Tokens: 1, Heads: 8, HeadDim: 128, RotDim: 128, Pos0: 7, Style: abi.RopeGPTJ})
	add("rope", l, err)
	l, err = RopeKVLaunch(RopeShape{Tokens: 1, Heads: 40, HeadDim: 128, RotDim: 64, Pos0: 7}, KVShape{Dim: 1024, KOff: 4096, VOff: 5120, Pos: 9})
	add("rope_kv", l, err)
	as := AttnShape{Heads: 32, KVHeads: 8, HeadDim: 128, KVLen: 100, Scale: 0.1}
	split, merge, _, err := AttentionLaunches(as)
	add("attention_split", split, err)
	add("attention_merge", merge, err)
	rs := RopeShape{Tokens: 1, Heads: 40, HeadDim: 128, RotDim: 128, Pos0: 99, Style: abi.RopeNeoX}
	rsplit, _, _, ok, err := RopeAttentionLaunches(as, rs, KVShape{Dim: 1024, KOff: 4096, VOff: 5120, Pos: 99})
	if err == nil && !ok {
		err = errors.New("the RoPE split does not take the step's shape")
	}
	add("attention_split_rope", rsplit, err)
	mq, err := MergeXQLaunch(merge, as)
	add("attention_merge_xq", mq, err)
	l, err = RMSNormXQLaunch(NormShape{Rows: 1, Dim: 4096, Eps: 1e-5})
	add("rmsnorm_xq", l, err)
	l, err = KVStoreLaunch(KVShape{Dim: 1024, KOff: 4096, VOff: 5120, Pos: 9})
	add("kv_store", l, err)
	l, err = RouteLaunch(RouteShape{Tokens: 2, Experts: 256, K: 8, Mode: abi.RouteSigmoidTopK, Groups: 8, TopKGroup: 4}, true)
	add("route", l, err)
	mixtral := RouteShape{Tokens: 1, Experts: 8, K: 2, Mode: abi.RouteSoftmaxTopK}
	l, err = RouterRouteLaunch(mixtral, 4096, false)
	add("route_mv", l, err)
	l, err = RouterRouteNormLaunch(mixtral, 4096, 1e-5)
	add("route_mv_norm", l, err)
	l, err = AccumulateRMSNormXQLaunch(AccumShape{Experts: 3, Dim: 4096, WeightOff: 2}, 1e-5)
	add("accumulate_rmsnorm_xq", l, err)
	l, err = AccumulateRMSNormXQToLaunch(AccumShape{Experts: 3, Dim: 4096, WeightOff: 2}, 1e-5)
	add("accumulate_rmsnorm_xq_out", l, err)
	for _, n := range []int{1000, 152064} {
		ls, _, err := ArgmaxLaunches(n)
		for _, l := range ls {
			add("argmax_blocks", l, err)
		}
	}
	for _, n := range []int{7, 151936} {
		ls, _, err := TopPLaunches(TopPShape{N: n, Temperature: 0.8, TopP: 0.9, U: 0.5})
		for _, l := range ls {
			add("topp_blocks", l, err)
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.err != nil {
				t.Fatal(c.err)
			}
			k, err := Builtin(c.l.Kernel, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.l.Bindings) != len(k.Bindings) {
				t.Errorf("%s: %d bindings; the kernel declares %d", c.l.Kernel, len(c.l.Bindings), len(k.Bindings))
			}
			if len(c.l.Params) > k.Params || len(c.l.Params)%4 != 0 {
				t.Errorf("%s: %d bytes of params; the kernel's block is %d", c.l.Kernel, len(c.l.Params), k.Params)
			}
			for i, g := range c.l.Groups {
				if g == 0 || g > 65535 {
					t.Errorf("%s: %d workgroups in dimension %d", c.l.Kernel, g, i)
				}
			}
			// The rule's constants are overrides of the kernel with
			// values of their type: it compiles with them.
			k.Constants = c.l.Constants
			p, err := shared.d.Compile(ctxT(t), k)
			if err != nil {
				t.Fatalf("%s with the rule's constants %v: %v", c.l.Kernel, c.l.Constants, err)
			}
			p.Release()
		})
	}
}
