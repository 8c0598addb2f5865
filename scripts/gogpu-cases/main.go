// Command gogpu-cases writes the decode step's Q4_K products of quantized
// x as the op library launches them (each kernel's WGSL with its rule's
// constants applied, its grid, params and bindings) as JSON, for
// scripts/gogpu-probe, which runs them on another WebGPU implementation
// (gogpu/wgpu, pure Go) beside kernels that implementation's compiler
// can take and ours cannot (dot4I8Packed).
//
//	go run ./scripts/gogpu-cases > scripts/gogpu-probe/cases.json
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/rdrr/peer/gpu"
	"github.com/rdrr/peer/gpu/abi"
	"github.com/rdrr/peer/gpu/ops"
)

// Case is one dispatch: Source's WGSL over Groups, Params in group 1's
// uniform, Bindings (group 0, in order) of the bytes given. Binding 0
// holds the weights, which the probe rotates beyond the L2; Bytes is what
// one dispatch must move.
type Case struct {
	Name     string    `json:"name"`
	Source   string    `json:"source"`
	Groups   [3]uint32 `json:"groups"`
	Params   []byte    `json:"params"`
	Bindings []Binding `json:"bindings"`
	Bytes    uint64    `json:"bytes"`
}

type Binding struct {
	Bytes uint64 `json:"bytes"`
	RW    bool   `json:"rw"`
}

func main() {
	var cases []Case
	for _, s := range [][2]int{{6144, 4096}, {4096, 4096}, {14336, 4096}, {4096, 14336}} {
		rows, cols := s[0], s[1]
		l, err := ops.Q4KXQLaunch(ops.DefaultQ4KConfig(rows, cols, 1), rows, cols)
		if err != nil {
			fail(err)
		}
		k, err := ops.Builtin(l.Kernel, l.Constants)
		if err != nil {
			fail(err)
		}
		src, err := k.Specialized()
		if err != nil {
			fail(err)
		}
		params := make([]byte, max(k.Params, len(l.Params)))
		copy(params, l.Params)
		c := Case{Name: fmt.Sprintf("xq/%dx%d", rows, cols), Source: src, Groups: l.Groups, Params: params,
			Bytes: abi.Q4K.Bytes(rows*cols) + ops.XQBytes(cols) + uint64(rows*4)}
		for i, b := range l.Bindings {
			c.Bindings = append(c.Bindings, Binding{Bytes: b.Bytes, RW: k.Bindings[i] == gpu.ReadWrite})
		}
		cases = append(cases, c)
	}
	e := json.NewEncoder(os.Stdout)
	e.SetIndent("", " ")
	if err := e.Encode(cases); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gogpu-cases:", err)
	os.Exit(1)
}
