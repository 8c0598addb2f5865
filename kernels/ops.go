package kernels

import (
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"
)

// An opSpec is what every variant of an op shares: the ABI (bindings,
// uniform layout and dispatch rule, numbered; the bindings and the
// uniform size come from the op's built-in kernel in gpu/ops), the built-in
// kernel that is the baseline, the constants the op needs that kernel to
// have, and the dimensions of its shape buckets.
type opSpec struct {
	builtin string             // gpu/ops.Builtin name
	abi     int                // bump when bindings, uniform layout or dispatch rule change
	fixed   map[string]float64 // constants the op sets on the built-in kernel
	dims    []string           // shape bucket dimensions, in order
}

// ops is a read-only table of the ops whose kernels can be varied,
// endorsed and pulled.
var ops = map[string]opSpec{
	"q4k_matvec":       {builtin: "q4k_matmul", abi: 1, dims: []string{"rows", "cols"}},
	"q4k_matvec_group": {builtin: "q4k_matmul", abi: 1, fixed: map[string]float64{"GROUPED": 1}, dims: []string{"products", "rows", "cols"}},
	"q4k_matmul":       {builtin: "q4k_matmul", abi: 1, dims: []string{"rows", "cols", "tokens"}},
	"q4k_dequant":      {builtin: "q4k_dequant", abi: 1, dims: []string{"weights"}},
	"dense_matmul":     {builtin: "dense_matmul", abi: 1, dims: []string{"rows", "cols", "tokens"}},
	"rmsnorm":          {builtin: "rmsnorm", abi: 1, dims: []string{"rows", "dim"}},
	"softmax":          {builtin: "softmax", abi: 1, dims: []string{"rows", "dim"}},
	"rope":             {builtin: "rope", abi: 1, dims: []string{"tokens", "heads", "headDim"}},
	"attention_decode": {builtin: "attention_split", abi: 5, dims: []string{"heads", "kvHeads", "headDim", "kvLen"}},
	"route_topk":       {builtin: "route", abi: 1, dims: []string{"tokens", "experts", "k"}},
	"swiglu":           {builtin: "swiglu", abi: 1, dims: []string{"n"}},
	"accumulate":       {builtin: "accumulate", abi: 1, dims: []string{"experts", "dim"}},
	"embed":            {builtin: "embed", abi: 1, dims: []string{"tokens", "dim"}},
	"argmax":           {builtin: "argmax_blocks", abi: 2, dims: []string{"n"}},
	"topp":             {builtin: "topp_blocks", abi: 2, dims: []string{"n"}},
}

// Ops returns the names of the ops, sorted.
func Ops() []string {
	names := make([]string, 0, len(ops))
	for n := range ops {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// BuiltinOf returns the name of op's built-in kernel (gpu/ops.Builtin),
// "" for an unknown op.
func BuiltinOf(op string) string { return ops[op].builtin }

func validOp(op string) bool { _, ok := ops[op]; return ok }

// ABIVersion returns this build's ABI version of op (0 for an unknown op).
func ABIVersion(op string) int { return ops[op].abi }

// ABIVersions returns this build's ABI version of every op: what a
// Verifier compares endorsements with.
func ABIVersions() map[string]int {
	m := make(map[string]int, len(ops))
	for n, s := range ops {
		m[n] = s.abi
	}
	return m
}

// ShapeDims returns the dimensions of op's shape buckets, in order.
func ShapeDims(op string) []string { return append([]string(nil), ops[op].dims...) }

// MaxDim bounds a shape dimension.
const MaxDim = 1 << 31

// Bucket returns op's shape bucket for dims (in ShapeDims(op) order): each
// dimension rounded up to a power of two and joined by "x", so a kernel
// endorsed for 4096x14336 also covers 4000x14000 (both are 4096x16384).
func Bucket(op string, dims ...int) (string, error) {
	spec, ok := ops[op]
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrUnknownOp, op)
	}
	if len(dims) != len(spec.dims) {
		return "", fmt.Errorf("kernels: %s takes %d dimensions (%s); got %d", op, len(spec.dims), strings.Join(spec.dims, ", "), len(dims))
	}
	for i, d := range dims {
		if d < 1 || d > MaxDim {
			return "", fmt.Errorf("kernels: %s %s = %d (want 1..%d)", op, spec.dims[i], d, MaxDim)
		}
	}
	return ShapeBucket(dims...), nil
}

// ShapeBucket rounds each dimension up to a power of two (anything below 2
// is 1) and joins them by "x".
func ShapeBucket(dims ...int) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		if d <= 1 {
			parts[i] = "1"
			continue
		}
		parts[i] = strconv.FormatUint(1<<bits.Len(uint(d-1)), 10)
	}
	return strings.Join(parts, "x")
}

// checkBucket reports whether s is a canonical bucket of op: the right
// number of powers of two in 1..MaxDim, decimal without leading zeros.
func checkBucket(op, s string) error {
	spec, ok := ops[op]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownOp, op)
	}
	parts := strings.Split(s, "x")
	if len(parts) != len(spec.dims) {
		return fmt.Errorf("shape %q: want %d dimensions (%s)", s, len(spec.dims), strings.Join(spec.dims, "x"))
	}
	for _, p := range parts {
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil || v == 0 || v > MaxDim || v&(v-1) != 0 || strconv.FormatUint(v, 10) != p {
			return fmt.Errorf("shape %q: %q is not a power of two in 1..%d", s, p, MaxDim)
		}
	}
	return nil
}
