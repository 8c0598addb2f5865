// Command compile compiles kernels on the first GPU, naming each on stderr
// just before it compiles, so that the line the vkstats layer writes after
// it (registers a thread, on NVIDIA) can be read against a kernel.
//
//	compile                       the decode step's kernels, Mixtral-shaped
//	compile -all                  and every other built-in, its defaults
//	compile NAME[=FILE][@K=V,...] FILE's WGSL (or NAME's own) with NAME's
//	                              bindings and the step's constants for
//	                              NAME, those after @ changed
//	compile -dump q4k_ffn_xq      print a built-in's WGSL (includes expanded)
//
// It exits 1 if a kernel did not compile. See ../README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ops"
)

func main() {
	dump := flag.String("dump", "", "print this built-in kernel's WGSL and exit")
	all := flag.Bool("all", false, "also compile every other built-in with its defaults")
	flag.Parse()
	if *dump != "" {
		k, err := ops.Builtin(*dump, nil)
		if err != nil {
			fail(err)
		}
		fmt.Print(k.Source)
		return
	}
	ks, err := kernels(*all, flag.Args())
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	// No idle pipelines kept: a kernel compiled again must reach the
	// driver, or the layer's next line would be another kernel's.
	d, err := gpu.Open(ctx, gpu.Options{IdlePipelines: -1})
	if err != nil {
		fail(err)
	}
	failed := 0
	for _, k := range ks {
		fmt.Fprintf(os.Stderr, "compile: %s %v\n", k.label, k.Constants)
		p, err := d.Compile(ctx, k.Kernel)
		if err != nil {
			fmt.Fprintf(os.Stderr, "compile: %s: %v\n", k.label, err)
			failed++
			continue
		}
		p.Release()
	}
	d.Close()
	if failed > 0 {
		fail(fmt.Errorf("%d of %d kernels did not compile", failed, len(ks)))
	}
}

type labeled struct {
	gpu.Kernel
	label string
}

// kernels lists what to compile: the step's products, every other
// built-in with all, then the arguments' variants.
func kernels(all bool, args []string) ([]labeled, error) {
	step, err := stepLaunches()
	if err != nil {
		return nil, err
	}
	consts := map[string]map[string]float64{}
	for _, l := range step {
		consts[l.Kernel] = l.Constants
	}
	var names []string
	for _, n := range ops.BuiltinNames() {
		if _, ok := consts[n]; ok || all {
			names = append(names, n)
		}
	}
	sort.SliceStable(names, func(i, j int) bool { // the step's first
		_, a := consts[names[i]]
		_, b := consts[names[j]]
		return a && !b
	})
	var out []labeled
	for _, n := range names {
		k, err := ops.Builtin(n, consts[n])
		if err != nil {
			return nil, err
		}
		out = append(out, labeled{k, n})
	}
	for _, a := range args {
		spec, set := a, ""
		if i := strings.LastIndex(a, "@"); i >= 0 && strings.Contains(a[i:], "=") {
			spec, set = a[:i], a[i+1:] // a file's name may hold an @
		}
		name, file, _ := strings.Cut(spec, "=")
		c := map[string]float64{}
		for k, v := range consts[name] {
			c[k] = v
		}
		for _, kv := range strings.Split(set, ",") {
			if kv == "" {
				continue
			}
			k, v, ok := strings.Cut(kv, "=")
			f, err := strconv.ParseFloat(v, 64)
			if !ok || err != nil {
				return nil, fmt.Errorf("%q: want K=V after @", kv)
			}
			c[k] = f
		}
		k, err := ops.Builtin(name, c)
		if err != nil {
			return nil, err
		}
		if file != "" {
			src, err := os.ReadFile(file)
			if err != nil {
				return nil, err
			}
			k.Source = string(src)
		}
		out = append(out, labeled{k, a})
	}
	if len(out) == 0 {
		return nil, errors.New("nothing to compile")
	}
	return out, nil
}

// stepLaunches are the launches of a resident Mixtral-shaped layer's
// products (hidden 4096, FFN width 14336, 8 experts, 2 chosen, q k v of
// 32 + 2 x 8 heads of 128, o), its attention and merge, its router and
// its norms.
func stepLaunches() ([]ops.Launch, error) {
	const hidden, width = 4096, 14336
	ffn, err := ops.FFNLaunch(ops.FFN{Gate: []int{0, 1, 2, 3, 4, 5, 6, 7}, Up: []int{8, 9, 10, 11, 12, 13, 14, 15},
		Down: []int{16, 17, 18, 19, 20, 21, 22, 23}, Experts: []int{0, 1, 2, 3, 4, 5, 6, 7}, K: 2, Hidden: hidden, Width: width})
	if err != nil {
		return nil, err
	}
	out := []ops.Launch{ffn}
	for _, rows := range []int{6144, 4096} { // q k v, o: the same constants
		l, err := ops.Q4KXQLaunch(ops.DefaultQ4KConfig(rows, hidden, 1), rows, hidden)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	// The attention at 600 positions, plain and as the step runs it
	// (RoPE in the split): their constants do not depend on the length.
	const heads, kvHeads, hd, pos = 32, 8, 128, 599
	as := ops.AttnShape{Heads: heads, KVHeads: kvHeads, HeadDim: hd, KVLen: pos + 1, Scale: 0.088}
	split, _, _, err := ops.AttentionLaunches(as)
	if err != nil {
		return nil, err
	}
	rs := ops.RopeShape{Tokens: 1, Heads: heads + kvHeads, HeadDim: hd, RotDim: hd, Pos0: pos}
	kv := ops.KVShape{Dim: kvHeads * hd, KOff: heads * hd, VOff: (heads + kvHeads) * hd, Pos: pos}
	rope, merge, _, fused, err := ops.RopeAttentionLaunches(as, rs, kv)
	if err != nil || !fused {
		return nil, fmt.Errorf("the RoPE attention's launch: fused %v, %v", fused, err)
	}
	merge, err = ops.MergeXQLaunch(merge, as) // the step's: its output quantized for the o product
	if err != nil {
		return nil, err
	}
	out = append(out, split, rope, merge)
	// The chain's small kernels with the constants their rules set: the
	// router beside the FFN norm, the norms of quantized x.
	mixtral := ops.RouteShape{Tokens: 1, Experts: 8, K: 2, Mode: abi.RouteSoftmaxTopK}
	router, err := ops.RouterRouteNormLaunch(mixtral, hidden, 1e-5)
	if err != nil {
		return nil, err
	}
	attnNorm, err := ops.AccumulateRMSNormXQLaunch(ops.AccumShape{Experts: 2, Dim: hidden}, 1e-5)
	if err != nil {
		return nil, err
	}
	ffnNorm, err := ops.AccumulateRMSNormXQToLaunch(ops.AccumShape{Experts: 1, Dim: hidden}, 1e-5)
	if err != nil {
		return nil, err
	}
	return append(out, router, attnNorm, ffnNorm), nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compile:", err)
	os.Exit(1)
}
