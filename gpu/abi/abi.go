// Package abi defines the enumerations that the built-in kernels, their
// callers and their float64 references agree on: element types (DType),
// RoPE pair layouts (RopeStyle) and routing modes (RouteMode). Their
// numeric values are what the kernels' uniform blocks carry, so there is
// one definition, here, for the op library (gpu/ops), the references
// (gpu/ref) and the kernel lab.
//
// The package is pure Go and imports nothing, so that gpu/ref and model
// tooling use it without cgo.
package abi

import "fmt"

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

// RopeStyle says which elements rotate together.
type RopeStyle int

const (
	// RopeNeoX rotates element i with i+rot/2 (GPT-NeoX, Llama in HF layout,
	// Mixtral, DeepSeek).
	RopeNeoX RopeStyle = iota
	// RopeGPTJ rotates element 2i with 2i+1 (GPT-J, Llama in GGUF layout).
	RopeGPTJ
)

func (s RopeStyle) String() string {
	switch s {
	case RopeNeoX:
		return "neox"
	case RopeGPTJ:
		return "gptj"
	}
	return fmt.Sprintf("RopeStyle(%d)", int(s))
}

// RouteMode selects how router logits become expert weights.
type RouteMode int

const (
	// RouteSoftmaxTopK (Mixtral): top-k of the logits, weights = softmax
	// over the selected logits.
	RouteSoftmaxTopK RouteMode = iota
	// RouteSigmoidTopK (DeepSeek-V3): s = sigmoid(logit); selection by
	// s + bias, optionally limited to the TopKGroup groups with the largest
	// sum of their two best selection scores; weights = s / sum(s selected)
	// * Scale.
	RouteSigmoidTopK
)

func (m RouteMode) String() string {
	switch m {
	case RouteSoftmaxTopK:
		return "softmax_topk"
	case RouteSigmoidTopK:
		return "sigmoid_topk"
	}
	return fmt.Sprintf("RouteMode(%d)", int(m))
}
