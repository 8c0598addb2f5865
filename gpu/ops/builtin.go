package ops

import (
	"embed"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/rdrr/peer/gpu"
)

//go:embed wgsl/*.wgsl wgsl/*.inc
var wgslFiles embed.FS

// builtin describes a built-in kernel: its WGSL file and ABI, and the
// flavor of the file it is (see flavored).
type builtin struct {
	file     string
	bindings []gpu.Access
	params   int
	flavor   string
}

const (
	ro = gpu.ReadOnly
	rw = gpu.ReadWrite
)

// builtins is a read-only table of the built-in kernels. Each one's
// dispatch rule is the *Launch function of its op (the file of the op).
var builtins = map[string]builtin{
	"q4k_matmul":        {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw}, 96, ""},
	"q4k_matmul_masked": {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro}, 176, "MASKED"},
	// Products of an RMSNorm's output handed over by accumulate_norm
	// (see q4k_matmul.wgsl's PART).
	"q4k_matmul_part":        {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro}, 112, "PART"},
	"q4k_matmul_masked_part": {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro, ro}, 192, "MASKED PART"},
	"dense_matmul_part":      {"dense_matmul.wgsl", []gpu.Access{ro, ro, rw, ro}, 32, "PART"},
	// An expert's gate and up products together, writing silu(gate) * up
	// (see q4k_matmul.wgsl's GLU).
	"q4k_matmul_glu":             {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw}, 96, "GLU"},
	"q4k_matmul_masked_glu":      {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro}, 176, "MASKED GLU"},
	"q4k_matmul_masked_part_glu": {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro, ro}, 192, "MASKED PART GLU"},
	// The same products of quantized x (see q4k_matmul.wgsl's XQ), and
	// the quantizer.
	"q4k_matmul_xq":               {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw}, 96, "XQ"},
	"q4k_matmul_glu_xq":           {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw}, 96, "GLU XQ"},
	"q4k_matmul_masked_xq":        {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro}, 176, "MASKED XQ"},
	"q4k_matmul_masked_glu_xq":    {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro}, 176, "MASKED GLU XQ"},
	"quantize_x":                  {"quantize_x.wgsl", []gpu.Access{ro, rw}, 8, ""},
	"q4k_matmul_glu_xq_yq":        {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, rw}, 96, "GLU XQ QOUT"},
	"q4k_matmul_masked_glu_xq_yq": {"q4k_matmul.wgsl", []gpu.Access{ro, ro, rw, ro, rw}, 176, "MASKED GLU XQ QOUT"},
	// A resident MoE layer's gate, up and down products in one dispatch
	// (ops.Q4KFFN).
	"q4k_ffn_xq":                {"q4k_ffn.wgsl", []gpu.Access{ro, ro, rw, ro, rw, rw}, 192, ""},
	"rmsnorm_xq":                {"quantize_x.wgsl", []gpu.Access{ro, ro, rw, rw}, 16, "NORM"},
	"accumulate_rmsnorm_xq":     {"quantize_x.wgsl", []gpu.Access{ro, ro, rw, ro, rw, rw}, 32, "NORM ADD"},
	"accumulate_rmsnorm_xq_out": {"quantize_x.wgsl", []gpu.Access{ro, ro, ro, ro, rw, rw, rw}, 32, "NORM ADD OUT"},
	"attention_merge_xq":        {"attention_merge.wgsl", []gpu.Access{ro, rw, rw}, 16, "XQ"},
	"accumulate_norm":           {"accumulate.wgsl", []gpu.Access{ro, ro, rw, ro, rw, rw}, 16, "NORM"},
	"q4k_dequant":               {"q4k_dequant.wgsl", []gpu.Access{ro, rw}, 8, ""},
	"q4k_matvec_co":             {"q4k_matvec_co.wgsl", []gpu.Access{ro, ro, rw}, 20, ""},
	"dense_matmul":              {"dense_matmul.wgsl", []gpu.Access{ro, ro, rw}, 20, ""},
	"rmsnorm":                   {"rmsnorm.wgsl", []gpu.Access{ro, ro, rw}, 16, ""},
	"softmax":                   {"softmax.wgsl", []gpu.Access{ro, rw}, 12, ""},
	"rope":                      {"rope.wgsl", []gpu.Access{rw, ro}, 28, ""},
	"rope_kv":                   {"rope.wgsl", []gpu.Access{rw, ro, rw, rw}, 44, "KV"},
	"attention_split":           {"attention_split.wgsl", []gpu.Access{ro, ro, ro, rw}, 32, ""},
	"attention_split_rope":      {"attention_split.wgsl", []gpu.Access{ro, rw, rw, rw, ro}, 48, "ROPE"},
	"attention_merge":           {"attention_merge.wgsl", []gpu.Access{ro, rw}, 16, ""},
	"route":                     {"route.wgsl", []gpu.Access{ro, ro, rw, rw}, 32, ""},
	"route_mv":                  {"route.wgsl", []gpu.Access{rw, ro, rw, rw, ro, ro}, 48, "MV"},
	"route_mv_norm":             {"route.wgsl", []gpu.Access{rw, ro, rw, rw, ro, ro, ro, ro}, 48, "MV NORM"},
	"swiglu":                    {"swiglu.wgsl", []gpu.Access{ro, ro, rw}, 8, ""},
	"accumulate":                {"accumulate.wgsl", []gpu.Access{ro, ro, rw}, 16, ""},
	"embed":                     {"embed.wgsl", []gpu.Access{ro, ro, rw}, 16, ""},
	"argmax_blocks":             {"argmax_blocks.wgsl", []gpu.Access{ro, rw}, 16, ""},
	"topp_blocks":               {"topp_blocks.wgsl", []gpu.Access{ro, rw, rw}, 32, ""},
	"copy":                      {"copy.wgsl", []gpu.Access{ro, rw}, 8, ""},
	"l2_prefetch":               {"l2_prefetch.wgsl", []gpu.Access{ro, rw}, 16, ""},
	"kv_store":                  {"kv_store.wgsl", []gpu.Access{ro, rw, rw}, 16, ""},
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
// measures variants against, the kernel a gpu.Variant stands in for, and
// a template for third-party WGSL with the same ABI.
func Builtin(name string, constants map[string]float64) (gpu.Kernel, error) {
	b, ok := builtins[name]
	if !ok {
		return gpu.Kernel{}, fmt.Errorf("%w: no built-in kernel %q", gpu.ErrCompile, name)
	}
	src, err := wgslFiles.ReadFile("wgsl/" + b.file)
	if err != nil {
		return gpu.Kernel{}, err
	}
	text, err := included(flavored(string(src), b.flavor))
	if err != nil {
		return gpu.Kernel{}, err
	}
	return gpu.Kernel{Name: name, Source: text, Constants: constants, Bindings: b.bindings, Params: b.params}, nil
}

// included returns src with each line "//#include NAME" replaced by the
// file wgsl/NAME (code that several kernels share, such as quantize.inc;
// WGSL has no includes). One level: an included file includes nothing.
func included(src string) (string, error) {
	if !strings.Contains(src, "//#include ") {
		return src, nil
	}
	lines := strings.SplitAfter(src, "\n")
	for i, l := range lines {
		name, ok := strings.CutPrefix(strings.TrimSpace(l), "//#include ")
		if !ok {
			continue
		}
		inc, err := wgslFiles.ReadFile("wgsl/" + name)
		if err != nil {
			return "", fmt.Errorf("%w: %v", gpu.ErrCompile, err)
		}
		lines[i] = string(inc)
	}
	return strings.Join(lines, ""), nil
}

// flavored returns src as flavor f, a space-separated set of names: a
// line starting with "//+n " is kept (without the marker) only in a
// flavor that has n, one starting with "//-n " only in one that lacks it;
// markers stack ("//+NORM //-MASKED ": with NORM, without MASKED). One
// WGSL file then holds kernels that differ in a binding or a field, which
// WGSL's override constants cannot add or remove.
func flavored(src string, f string) string {
	if !strings.Contains(src, "//+") && !strings.Contains(src, "//-") {
		return src
	}
	has := strings.Fields(f)
	lines := strings.SplitAfter(src, "\n")
	out := lines[:0]
line:
	for _, l := range lines {
		for {
			t := strings.TrimLeft(l, " ")
			plus := strings.HasPrefix(t, "//+")
			if !plus && !strings.HasPrefix(t, "//-") {
				break
			}
			name, rest, _ := strings.Cut(t[3:], " ")
			if slices.Contains(has, name) != plus {
				continue line
			}
			l = rest
		}
		out = append(out, l)
	}
	return strings.Join(out, "")
}
