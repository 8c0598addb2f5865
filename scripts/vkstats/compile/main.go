// Command compile compiles kernels on the first GPU, naming each on stderr
// just before it compiles, so that the line the vkstats layer writes after
// it (registers a thread, on NVIDIA) can be read against a kernel.
//
//	compile                       the decode step's kernels, Mixtral-shaped
//	compile -dump q4k_ffn_xq      print a built-in's WGSL (includes expanded)
//	compile -all                  and every other built-in, its defaults
//	compile NAME[=FILE][@K=V,...] FILE's WGSL (or NAME's own) with NAME's
//	                              bindings and the step's constants for
//	                              NAME, those after @ changed
//
// See ../README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/rdrr/peer/gpu"
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
	ctx := context.Background()
	d, err := gpu.Open(ctx, gpu.Options{})
	if err != nil {
		fail(err)
	}
	defer d.Close()
	step, err := stepLaunches()
	if err != nil {
		fail(err)
	}
	consts := map[string]map[string]float64{}
	for _, l := range step {
		consts[l.Kernel] = l.Constants
	}
	names := make([]string, 0, len(step))
	for n := range consts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		k, err := ops.Builtin(n, consts[n])
		if err != nil {
			fail(err)
		}
		compile(ctx, d, n, k)
	}
	if *all {
		for _, n := range ops.BuiltinNames() {
			if _, ok := consts[n]; ok {
				continue
			}
			k, err := ops.Builtin(n, nil)
			if err != nil {
				fail(err)
			}
			compile(ctx, d, n, k)
		}
	}
	for _, a := range flag.Args() {
		spec, set, _ := strings.Cut(a, "@")
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
				fail(fmt.Errorf("%q: want K=V after @", kv))
			}
			c[k] = f
		}
		k, err := ops.Builtin(name, c)
		if err != nil {
			fail(err)
		}
		if file != "" {
			src, err := os.ReadFile(file)
			if err != nil {
				fail(err)
			}
			k.Source = string(src)
		}
		compile(ctx, d, a, k)
	}
}

func compile(ctx context.Context, d *gpu.Device, label string, k gpu.Kernel) {
	fmt.Fprintf(os.Stderr, "compile: %s %v\n", label, k.Constants)
	p, err := d.Compile(ctx, k)
	if err != nil {
		fmt.Fprintf(os.Stderr, "compile: %s: %v\n", label, err)
		return
	}
	p.Release()
}

// stepLaunches are the launches of a resident Mixtral-shaped layer's
// products (hidden 4096, FFN width 14336, 8 experts, 2 chosen, q k v of
// 32 + 2 x 8 heads of 128).
func stepLaunches() ([]ops.Launch, error) {
	const hidden, width = 4096, 14336
	ffn, err := ops.FFNLaunch(ops.FFN{Gate: []int{0, 1, 2, 3, 4, 5, 6, 7}, Up: []int{8, 9, 10, 11, 12, 13, 14, 15},
		Down: []int{16, 17, 18, 19, 20, 21, 22, 23}, Experts: []int{0, 1, 2, 3, 4, 5, 6, 7}, K: 2, Hidden: hidden, Width: width})
	if err != nil {
		return nil, err
	}
	out := []ops.Launch{ffn}
	for _, rows := range []int{6144, 4096} { // q k v, o
		l, err := ops.Q4KXQLaunch(ops.DefaultQ4KConfig(rows, hidden, 1), rows, hidden)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "compile:", err)
	os.Exit(1)
}
