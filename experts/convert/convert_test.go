package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/experts/gguf"
	"github.com/rdrr/peer/experts/safetensors"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/x448/float16"
)

const (
	hidden  = 256
	ffn     = 512
	layers  = 2
	nexp    = 4
	vocab   = 16
	qrowLen = hidden / 256 * 144
)

func randQ4K(r *rand.Rand, rows, cols int) []byte {
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	b := make([]byte, q4k.RowBytes(cols)*rows)
	q4k.Quantize(b, w)
	return b
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func f32s(r *rand.Rand, n int) []byte {
	b := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(r.NormFloat64())))
	}
	return b
}

func f16s(r *rand.Rand, n int) []byte {
	b := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		binary.LittleEndian.PutUint16(b[2*i:], float16.Fromfloat32(float32(r.NormFloat64()*0.05)).Bits())
	}
	return b
}

// writeMixtralGGUF writes a small Mixtral-shaped GGUF: stacked Q4_K
// experts, F16 attention, F32 norms and router, a tokenizer.
// writeMixtralGGUF writes a tiny Mixtral-shaped GGUF; extra keys replace
// the default ones of the same name or are added.
func writeMixtralGGUF(t *testing.T, path string, stacked bool, alignment uint64, extra ...gguf.KV) map[string][]byte {
	r := rand.New(rand.NewPCG(1, 2))
	want := map[string][]byte{} // RDRR name -> bytes
	var ts []gguf.WriteTensor
	add := func(gname, rname string, dims []uint64, typ gguf.TensorType, data []byte) {
		ts = append(ts, gguf.WriteTensor{Name: gname, Dims: dims, Type: typ, Data: data})
		if rname != "" {
			want[rname] = data
		}
	}
	add("token_embd.weight", "model.embed_tokens.weight", []uint64{hidden, vocab}, gguf.Q4_K, randQ4K(r, vocab, hidden))
	for l := 0; l < layers; l++ {
		p := func(s string) string { return "blk." + itoa(l) + "." + s }
		h := func(s string) string { return "model.layers." + itoa(l) + "." + s }
		add(p("attn_norm.weight"), h("input_layernorm.weight"), []uint64{hidden}, gguf.F32, f32s(r, hidden))
		for _, x := range []string{"q", "k", "v", "output"} {
			name := map[string]string{"q": "q_proj", "k": "k_proj", "v": "v_proj", "output": "o_proj"}[x]
			add(p("attn_"+x+".weight"), h("self_attn."+name+".weight"), []uint64{hidden, hidden}, gguf.F16, f16s(r, hidden*hidden))
		}
		add(p("ffn_norm.weight"), h("post_attention_layernorm.weight"), []uint64{hidden}, gguf.F32, f32s(r, hidden))
		add(p("ffn_gate_inp.weight"), h("mlp.gate.weight"), []uint64{hidden, nexp}, gguf.F32, f32s(r, hidden*nexp))
		for part, x := range []string{"gate", "up", "down"} {
			rows, cols := ffn, hidden
			if x == "down" {
				rows, cols = hidden, ffn
			}
			var all []byte
			for e := 0; e < nexp; e++ {
				b := randQ4K(r, rows, cols)
				want[expertName(l, e, part)] = b
				if !stacked {
					add(p("ffn_"+x+"."+itoa(e)+".weight"), "", []uint64{uint64(cols), uint64(rows)}, gguf.Q4_K, b)
				}
				all = append(all, b...)
			}
			if stacked {
				add(p("ffn_"+x+"_exps.weight"), "", []uint64{uint64(cols), uint64(rows), nexp}, gguf.Q4_K, all)
			}
		}
	}
	add("output_norm.weight", "model.norm.weight", []uint64{hidden}, gguf.F32, f32s(r, hidden))
	add("output.weight", "lm_head.weight", []uint64{hidden, vocab}, gguf.Q4_K, randQ4K(r, vocab, hidden))
	toks := make([]string, vocab)
	for i := range toks {
		toks[i] = "t" + itoa(i)
	}
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "llama"},
		{Key: "general.name", Value: "tiny-mixtral"},
		{Key: "llama.embedding_length", Value: uint32(hidden)},
		{Key: "llama.block_count", Value: uint32(layers)},
		{Key: "llama.attention.head_count", Value: uint32(4)},
		{Key: "llama.attention.head_count_kv", Value: uint32(2)},
		{Key: "llama.feed_forward_length", Value: uint32(ffn)},
		{Key: "llama.expert_count", Value: uint32(nexp)},
		{Key: "llama.expert_used_count", Value: uint32(2)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: "llama.rope.freq_base", Value: float32(1e6)},
		{Key: "tokenizer.ggml.model", Value: "llama"},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Array{Type: gguf.TypeString, Values: toks}},
		{Key: "tokenizer.ggml.bos_token_id", Value: uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: uint32(2)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: uint32(0)},
		{Key: "tokenizer.ggml.add_bos_token", Value: false},
	}
	for _, e := range extra {
		i := slices.IndexFunc(kv, func(k gguf.KV) bool { return k.Key == e.Key })
		if i < 0 {
			kv = append(kv, e)
		} else {
			kv[i] = e
		}
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kv, ts, alignment); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return want
}

func itoa(i int) string { return string(appendInt(nil, i)) }
func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

// readTensor returns a tensor's bytes from a converted model directory.
func readTensor(t *testing.T, dir string, m *experts.Manifest, name string) []byte {
	t.Helper()
	mt, ok := m.Tensors[name]
	if !ok {
		t.Fatalf("no tensor %s in the manifest", name)
	}
	var out []byte
	for _, r := range m.Ranges(mt.Shard, mt.Offset, mt.Size) {
		b, err := os.ReadFile(filepath.Join(dir, m.Shards[r.Shard].Filename))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b[r.Offset:r.Offset+r.Size]...)
	}
	return out
}

func checkConverted(t *testing.T, dir string, want map[string][]byte) *experts.Manifest {
	t.Helper()
	m, err := experts.ReadManifestFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range want {
		if got := readTensor(t, dir, m, name); !bytes.Equal(got, b) {
			t.Errorf("%s: converted bytes differ from the source", name)
		}
	}
	if len(m.Experts) != layers*nexp {
		t.Errorf("%d experts indexed; want %d", len(m.Experts), layers*nexp)
	}
	// The store takes it: every shard matches its hash.
	return m
}

func TestConvertGGUF(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stacked   bool
		alignment uint64
	}{{"stacked", true, 32}, {"per-expert", false, 32}, {"alignment 64", true, 64}, {"alignment 1", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "m.gguf")
			want := writeMixtralGGUF(t, in, tc.stacked, tc.alignment)
			out := filepath.Join(dir, "out")
			if _, err := Convert(context.Background(), in, out, Options{}); err != nil {
				t.Fatal(err)
			}
			m := checkConverted(t, out, want)
			if m.Tokenizer == nil || len(m.Tokenizer.Tokens) != vocab || m.Tokenizer.BOS != 1 || m.Tokenizer.EOS != 2 {
				t.Errorf("tokenizer %+v", m.Tokenizer)
			} else if tk := m.Tokenizer; tk.AddBOS == nil || *tk.AddBOS || tk.AddEOS != nil || tk.UNK == nil || *tk.UNK != 0 || tk.PAD != nil {
				// The file's add_bos_token false and unknown_token_id 0; no add_eos_token, no padding_token_id.
				f, _ := json.Marshal(struct{ AddBOS, AddEOS, UNK, PAD any }{tk.AddBOS, tk.AddEOS, tk.UNK, tk.PAD})
				t.Errorf("tokenizer flags %s; want add_bos false, add_eos null, unk 0, pad null", f)
			}
			if c := m.Config; c.Experts() != nexp || c.NumExpertsPerTok != 2 || c.NumKeyValueHeads != 2 || c.VocabSize != vocab {
				t.Errorf("config %+v", c)
			}
			if sh := m.Tensors["model.layers.0.mlp.experts.1.down_proj.weight"].Shape; sh[0] != hidden || sh[1] != ffn {
				t.Errorf("down_proj shape %v; want [%d %d]", sh, hidden, ffn)
			}
		})
	}
}

// A model llama.cpp strips whitespace for (Phi-3: its control tokens strip
// on the right) keeps those ids in its manifest's tokenizer.
func TestConvertGGUFStrip(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "m.gguf")
	types := make([]int32, vocab)
	for i := range types {
		types[i] = 1 // normal
	}
	types[1], types[2], types[5] = 3, 3, 3 // control: BOS, EOS and one more
	want := writeMixtralGGUF(t, in, true, 32,
		gguf.KV{Key: "general.name", Value: "Phi-3-tiny"},
		gguf.KV{Key: "tokenizer.ggml.token_type", Value: gguf.Array{Type: gguf.TypeInt32, Values: types}})
	out := filepath.Join(dir, "out")
	if _, err := Convert(context.Background(), in, out, Options{}); err != nil {
		t.Fatal(err)
	}
	m := checkConverted(t, out, want)
	if tk := m.Tokenizer; tk == nil || !slices.Equal(tk.RStrip, []int{1, 2, 5}) || tk.LStrip != nil {
		t.Fatalf("tokenizer strips %v on the left, %v on the right; want none, [1 2 5]", tk.LStrip, tk.RStrip)
	}
}

// An unsupported tensor type is refused by name.
func TestConvertUnsupportedType(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "q8.gguf")
	var buf bytes.Buffer
	gguf.Write(&buf, []gguf.KV{{Key: "general.architecture", Value: "llama"}}, []gguf.WriteTensor{{Name: "x", Dims: []uint64{32}, Type: gguf.Q8_0, Data: make([]byte, 34)}}, 0)
	os.WriteFile(in, buf.Bytes(), 0o644)
	_, err := Convert(context.Background(), in, filepath.Join(dir, "out"), Options{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("Q8_0")) {
		t.Fatalf("Convert of a Q8_0 tensor: %v; want an error naming Q8_0", err)
	}
}

// A DeepSeek-shaped safetensors model (sharded, BF16, a dense first layer,
// a shared expert), quantized to Q4_K.
func TestConvertSafetensorsQuantize(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	dir := t.TempDir()
	bf16 := func(n int) ([]byte, []float32) {
		b := make([]byte, 2*n)
		f := make([]float32, n)
		for i := 0; i < n; i++ {
			bits := uint16(math.Float32bits(float32(r.NormFloat64()*0.02)) >> 16)
			binary.LittleEndian.PutUint16(b[2*i:], bits)
			f[i] = math.Float32frombits(uint32(bits) << 16)
		}
		return b, f
	}
	floats := map[string][]float32{}
	var files [2][]safetensors.WriteTensor
	add := func(file int, name string, shape []uint64) {
		n := 1
		for _, d := range shape {
			n *= int(d)
		}
		b, f := bf16(n)
		files[file] = append(files[file], safetensors.WriteTensor{Name: name, DType: "BF16", Shape: shape, Data: b})
		floats[name] = f
	}
	add(0, "model.embed_tokens.weight", []uint64{vocab, hidden})
	for l := 0; l < layers; l++ {
		p := "model.layers." + itoa(l) + "."
		add(l, p+"input_layernorm.weight", []uint64{hidden})
		add(l, p+"self_attn.q_proj.weight", []uint64{hidden, hidden})
		if l == 0 {
			add(l, p+"mlp.gate_proj.weight", []uint64{ffn, hidden})
			add(l, p+"mlp.up_proj.weight", []uint64{ffn, hidden})
			add(l, p+"mlp.down_proj.weight", []uint64{hidden, ffn})
			continue
		}
		add(l, p+"mlp.gate.weight", []uint64{nexp, hidden})
		add(l, p+"mlp.shared_experts.gate_proj.weight", []uint64{ffn, hidden})
		for e := 0; e < nexp; e++ {
			q := p + "mlp.experts." + itoa(e) + "."
			add(l, q+"gate_proj.weight", []uint64{ffn, hidden})
			add(l, q+"up_proj.weight", []uint64{ffn, hidden})
			add(l, q+"down_proj.weight", []uint64{hidden, ffn})
		}
	}
	add(1, "model.norm.weight", []uint64{hidden})
	add(1, "lm_head.weight", []uint64{vocab, hidden})
	index := map[string]any{"weight_map": map[string]string{}}
	for i, ts := range files {
		name := "model-0000" + itoa(i+1) + "-of-00002.safetensors"
		var buf bytes.Buffer
		safetensors.Write(&buf, ts, nil)
		os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644)
		for _, t := range ts {
			index["weight_map"].(map[string]string)[t.Name] = name
		}
	}
	ib, _ := json.Marshal(index)
	os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), ib, 0o644)
	cfg := `{"model_type":"deepseek_v3","hidden_size":256,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,
	"intermediate_size":512,"moe_intermediate_size":512,"n_routed_experts":4,"n_shared_experts":1,"num_experts_per_tok":2,
	"first_k_dense_replace":1,"vocab_size":16,"rms_norm_eps":1e-6,"rope_theta":10000,"architectures":["DeepseekV3ForCausalLM"]}`
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)

	out := filepath.Join(t.TempDir(), "out")
	m, err := Convert(context.Background(), dir, out, Options{Quantize: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Experts) != nexp || m.Experts[0].Layer != 1 {
		t.Fatalf("%d experts, first in layer %d; want %d in layer 1", len(m.Experts), m.Experts[0].Layer, nexp)
	}
	for name, f := range floats {
		mt := m.Tensors[name]
		got := readTensor(t, out, m, name)
		switch mt.DType {
		case experts.Q4K:
			// Quantized with the Q4_K reference: exactly its bytes.
			want := make([]byte, q4k.RowBytes(len(f)))
			q4k.Quantize(want, f)
			if !bytes.Equal(got, want) {
				t.Errorf("%s: Q4_K bytes differ from quantizing the source", name)
			}
		case experts.BF16:
			if name != "model.layers.1.mlp.gate.weight" && !bytes.Contains([]byte(name), []byte("norm")) {
				t.Errorf("%s kept as BF16; want Q4_K", name)
			}
			for i := range f {
				if v := math.Float32frombits(uint32(binary.LittleEndian.Uint16(got[2*i:])) << 16); v != f[i] {
					t.Fatalf("%s[%d] = %g; want %g", name, i, v, f[i])
				}
			}
		default:
			t.Errorf("%s: dtype %s", name, mt.DType)
		}
	}
}

// BenchmarkConvertGGUF converts a GGUF of Q4_K experts (passthrough: copy,
// hash, fsync) and reports its throughput as a ratio of two limits measured
// in the same run, warm page cache for all: a raw read of the file, and a
// plain copy of it (read, write, fsync: what any converter must do).
func BenchmarkConvertGGUF(b *testing.B) {
	dir := b.TempDir()
	in := filepath.Join(dir, "m.gguf")
	r := rand.New(rand.NewPCG(5, 6))
	var ts []gguf.WriteTensor
	const rows, cols, n = 4096, 4096, 16 // 16 experts of 9.4 MB
	for e := 0; e < n; e++ {
		ts = append(ts, gguf.WriteTensor{Name: "blk.0.ffn_gate." + itoa(e) + ".weight", Dims: []uint64{cols, rows}, Type: gguf.Q4_K, Data: randBytes(r, q4k.RowBytes(cols)*rows)})
	}
	var buf bytes.Buffer
	gguf.Write(&buf, []gguf.KV{{Key: "general.architecture", Value: "llama"}, {Key: "llama.embedding_length", Value: uint32(cols)},
		{Key: "llama.block_count", Value: uint32(1)}, {Key: "llama.attention.head_count", Value: uint32(32)},
		{Key: "llama.feed_forward_length", Value: uint32(rows)}, {Key: "llama.expert_count", Value: uint32(n)},
		{Key: "llama.expert_used_count", Value: uint32(2)}, {Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: "llama.vocab_size", Value: uint32(32000)}}, ts, 0)
	os.WriteFile(in, buf.Bytes(), 0o644)
	size := int64(buf.Len())
	b.SetBytes(size)
	var raw, cp, conv float64
	copyBuf := make([]byte, 4<<20)
	for i := 0; i < b.N; i++ {
		t0 := nowSeconds()
		f, _ := os.Open(in)
		for {
			if _, err := f.Read(copyBuf); err != nil {
				break
			}
		}
		f.Close()
		raw += nowSeconds() - t0
		t0 = nowSeconds()
		src, _ := os.Open(in)
		dst, _ := os.Create(filepath.Join(dir, "copy"))
		io.CopyBuffer(dst, src, copyBuf)
		dst.Sync()
		dst.Close()
		src.Close()
		cp += nowSeconds() - t0
		os.Remove(filepath.Join(dir, "copy"))
		out := filepath.Join(dir, "out"+itoa(i))
		t0 = nowSeconds()
		if _, err := Convert(context.Background(), in, out, Options{}); err != nil {
			b.Fatal(err)
		}
		conv += nowSeconds() - t0
		os.RemoveAll(out)
	}
	b.ReportMetric(float64(size)*float64(b.N)/raw/1e6, "raw-read-MB/s")
	b.ReportMetric(raw/conv, "x-raw-read")
	b.ReportMetric(cp/conv, "x-copy")
}

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }
