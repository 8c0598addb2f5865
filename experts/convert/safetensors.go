package convert

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"

	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/experts/safetensors"
)

var (
	// Mixtral: block_sparse_moe.experts.E.w1 (gate), w3 (up), w2 (down).
	mixtralExpertRe = regexp.MustCompile(`^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.w([123])\.weight$`)
	mixtralPart     = map[string]int{"1": 0, "3": 1, "2": 2}
	// DeepSeek and Qwen-MoE: mlp.experts.E.{gate,up,down}_proj.
	hfExpertRe  = regexp.MustCompile(`^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$`)
	mixtralGate = regexp.MustCompile(`^model\.layers\.(\d+)\.block_sparse_moe\.gate\.weight$`)
)

// openSafetensors reads a HuggingFace model directory.
func openSafetensors(dir string) (*experts.Manifest, []*tensor, io.Closer, error) {
	cb, err := readFileMax(filepath.Join(dir, "config.json"), 1<<20)
	if err != nil {
		return nil, nil, nil, err
	}
	m := &experts.Manifest{ModelID: filepath.Base(dir), Version: 1, Quantization: "Q4_K", HashAlgorithm: "blake3"}
	if err := json.Unmarshal(cb, &m.Config); err != nil {
		return nil, nil, nil, fmt.Errorf("%s/config.json: %w", dir, err)
	}
	var named struct {
		Name string `json:"_name_or_path"`
	}
	if json.Unmarshal(cb, &named) == nil && named.Name != "" {
		m.ModelID = named.Name
	}
	sm, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	var out []*tensor
	for name, st := range sm.Tensors {
		var dt experts.DType
		switch st.DType {
		case "F32":
			dt = experts.F32
		case "F16":
			dt = experts.F16
		case "BF16":
			dt = experts.BF16
		default:
			sm.Close()
			return nil, nil, nil, fmt.Errorf("tensor %s: %w: dtype %s (F32, F16 and BF16 are)", name, ErrUnsupported, st.DType)
		}
		shape := make([]int64, len(st.Shape))
		for i, d := range st.Shape {
			shape[i] = int64(d)
		}
		if len(shape) == 0 {
			shape = []int64{1}
		}
		t := &tensor{name: name, dtype: dt, shape: shape, src: st.Section(), layer: -1}
		if mm := mixtralExpertRe.FindStringSubmatch(name); mm != nil {
			err = t.setExpert(name, mm[1], mm[2], mixtralPart[mm[3]])
		} else if mm := hfExpertRe.FindStringSubmatch(name); mm != nil {
			err = t.setExpert(name, mm[1], mm[2], partIndex[mm[3]])
		} else if mixtralGate.MatchString(name) {
			t.name = mixtralGate.ReplaceAllString(name, "model.layers.$1.mlp.gate.weight")
		}
		if err != nil {
			sm.Close()
			return nil, nil, nil, err
		}
		out = append(out, t)
	}
	return m, out, sm, nil
}

// readFileMax reads a whole file of at most max bytes, refusing a larger
// one before reading it.
func readFileMax(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s is over %d bytes", path, max)
	}
	return b, nil
}
