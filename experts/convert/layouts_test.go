package convert

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/rdrr/peer/experts"
	"github.com/rdrr/peer/experts/gguf"
	"github.com/rdrr/peer/experts/safetensors"
	"github.com/rdrr/peer/gpu/q4k"
	"github.com/x448/float16"
)

// A HuggingFace Mixtral (block_sparse_moe.experts.E.w1/w2/w3, one
// model.safetensors, F16) converts without quantizing: every tensor
// byte-exact, experts renamed and indexed gate, up, down.
func TestConvertSafetensorsMixtral(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	dir := t.TempDir()
	want := map[string][]byte{}
	var ts []safetensors.WriteTensor
	add := func(name, rdrr string, shape ...uint64) {
		n := 1
		for _, d := range shape {
			n *= int(d)
		}
		b := f16s(r, n)
		ts = append(ts, safetensors.WriteTensor{Name: name, DType: "F16", Shape: shape, Data: b})
		want[rdrr] = b
	}
	add("model.embed_tokens.weight", "model.embed_tokens.weight", vocab, hidden)
	for l := 0; l < layers; l++ {
		p := "model.layers." + itoa(l) + "."
		add(p+"input_layernorm.weight", p+"input_layernorm.weight", hidden)
		add(p+"self_attn.q_proj.weight", p+"self_attn.q_proj.weight", hidden, hidden)
		add(p+"block_sparse_moe.gate.weight", p+"mlp.gate.weight", nexp, hidden)
		for e := 0; e < nexp; e++ {
			q := p + "block_sparse_moe.experts." + itoa(e) + "."
			add(q+"w1.weight", expertName(l, e, 0), ffn, hidden)
			add(q+"w3.weight", expertName(l, e, 1), ffn, hidden)
			add(q+"w2.weight", expertName(l, e, 2), hidden, ffn)
		}
	}
	add("model.norm.weight", "model.norm.weight", hidden)
	add("lm_head.weight", "lm_head.weight", vocab, hidden)
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "model.safetensors"), buf.Bytes(), 0o644)
	cfg := `{"model_type":"mixtral","hidden_size":256,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
	"intermediate_size":512,"num_local_experts":4,"num_experts_per_tok":2,"vocab_size":16,"rms_norm_eps":1e-5,"rope_theta":1e6,
	"_name_or_path":"tiny/mixtral"}`
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)

	out := filepath.Join(t.TempDir(), "out")
	m, err := Convert(context.Background(), dir, out, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkConverted(t, out, want)
	if m.ModelID != "tiny/mixtral" || m.Quantization != "F16" || len(m.Tensors) != len(want) {
		t.Errorf("model %q, quantization %q, %d tensors; want tiny/mixtral, F16, %d", m.ModelID, m.Quantization, len(m.Tensors), len(want))
	}
	e := m.Experts[5] // layer 1, expert 1
	wantNames := []string{expertName(1, 1, 0), expertName(1, 1, 1), expertName(1, 1, 2)}
	if e.Layer != 1 || e.Index != 1 || !slices.Equal(e.Tensors, wantNames) {
		t.Errorf("experts[5] = layer %d expert %d %v; want layer 1 expert 1 %v", e.Layer, e.Index, e.Tensors, wantNames)
	}
}

// writeDeepSeekGGUF writes a DeepSeek-shaped GGUF (deepseek2: a dense
// first layer, stacked F16 experts, a shared expert, the routing bias)
// and returns its float tensors by RDRR name.
func writeDeepSeekGGUF(t *testing.T, path string) map[string][]float32 {
	r := rand.New(rand.NewPCG(9, 10))
	floats := map[string][]float32{}
	var ts []gguf.WriteTensor
	add := func(gname, rname string, dims ...uint64) {
		n := 1
		for _, d := range dims {
			n *= int(d)
		}
		b := f16s(r, n)
		f := make([]float32, n)
		for i := range f {
			f[i] = float16.Frombits(binary.LittleEndian.Uint16(b[2*i:])).Float32()
		}
		ts = append(ts, gguf.WriteTensor{Name: gname, Dims: dims, Type: gguf.F16, Data: b})
		if strings.Contains(gname, "_exps") { // [cols, rows, experts]: one slice per expert
			per := n / nexp
			part := map[string]int{"gate": 0, "up": 1, "down": 2}[strings.Split(strings.Split(gname, "ffn_")[1], "_")[0]]
			for e := 0; e < nexp; e++ {
				floats[expertName(1, e, part)] = f[e*per : (e+1)*per]
			}
			return
		}
		floats[rname] = f
	}
	add("token_embd.weight", "model.embed_tokens.weight", hidden, vocab)
	add("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight", hidden)
	add("blk.0.attn_q_a.weight", "model.layers.0.self_attn.q_a_proj.weight", hidden, hidden)
	add("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight", hidden, ffn)
	add("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight", hidden, ffn)
	add("blk.0.ffn_down.weight", "model.layers.0.mlp.down_proj.weight", ffn, hidden)
	add("blk.1.attn_kv_b.weight", "model.layers.1.self_attn.kv_b_proj.weight", hidden, hidden)
	add("blk.1.ffn_gate_inp.weight", "model.layers.1.mlp.gate.weight", hidden, nexp)
	add("blk.1.exp_probs_b.bias", "model.layers.1.mlp.gate.e_score_correction_bias", nexp)
	add("blk.1.ffn_gate_shexp.weight", "model.layers.1.mlp.shared_experts.gate_proj.weight", hidden, ffn)
	add("blk.1.ffn_up_shexp.weight", "model.layers.1.mlp.shared_experts.up_proj.weight", hidden, ffn)
	add("blk.1.ffn_down_shexp.weight", "model.layers.1.mlp.shared_experts.down_proj.weight", ffn, hidden)
	add("blk.1.ffn_gate_exps.weight", "", hidden, ffn, nexp)
	add("blk.1.ffn_up_exps.weight", "", hidden, ffn, nexp)
	add("blk.1.ffn_down_exps.weight", "", ffn, hidden, nexp)
	add("output_norm.weight", "model.norm.weight", hidden)
	add("output.weight", "lm_head.weight", hidden, vocab)
	kv := []gguf.KV{
		{Key: "general.architecture", Value: "deepseek2"},
		{Key: "general.name", Value: "tiny-deepseek"},
		{Key: "deepseek2.embedding_length", Value: uint32(hidden)},
		{Key: "deepseek2.block_count", Value: uint32(layers)},
		{Key: "deepseek2.attention.head_count", Value: uint32(4)},
		{Key: "deepseek2.feed_forward_length", Value: uint32(ffn)},
		{Key: "deepseek2.expert_feed_forward_length", Value: uint32(ffn)},
		{Key: "deepseek2.expert_count", Value: uint32(nexp)},
		{Key: "deepseek2.expert_used_count", Value: uint32(2)},
		{Key: "deepseek2.expert_shared_count", Value: uint32(1)},
		{Key: "deepseek2.leading_dense_block_count", Value: uint32(1)},
		{Key: "deepseek2.attention.layer_norm_rms_epsilon", Value: float32(1e-6)},
		{Key: "deepseek2.vocab_size", Value: uint32(vocab)},
	}
	var buf bytes.Buffer
	if err := gguf.Write(&buf, kv, ts, 64); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return floats
}

// A DeepSeek-shaped GGUF converts as it is (F16 byte-exact) and with
// --quantize Q4_K: matrices become exactly the Q4_K reference's bytes of
// the source and dequantize close to it; norms, the router and the bias
// keep F16.
func TestConvertGGUFDeepSeek(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "ds.gguf")
	floats := writeDeepSeekGGUF(t, in)
	for _, quantize := range []bool{false, true} {
		out := filepath.Join(dir, "out"+map[bool]string{false: "-f16", true: "-q4k"}[quantize])
		m, err := Convert(context.Background(), in, out, Options{Quantize: quantize})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Experts) != nexp || m.Experts[0].Layer != 1 || m.Config.FirstKDenseReplace != 1 || m.Config.NumSharedExperts != 1 {
			t.Fatalf("%d experts from layer %d, config %+v", len(m.Experts), m.Experts[0].Layer, m.Config)
		}
		if len(m.Tensors) != len(floats) {
			t.Errorf("%d tensors; want %d", len(m.Tensors), len(floats))
		}
		for name, f := range floats {
			mt, ok := m.Tensors[name]
			if !ok {
				t.Errorf("no tensor %s", name)
				continue
			}
			got := readTensor(t, out, m, name)
			keep := strings.Contains(name, "norm") || strings.HasSuffix(name, "mlp.gate.weight") || strings.HasSuffix(name, "bias")
			switch mt.DType {
			case experts.F16:
				if quantize && !keep {
					t.Errorf("%s kept as F16; want Q4_K", name)
				}
				for i := range f {
					if v := float16.Frombits(binary.LittleEndian.Uint16(got[2*i:])).Float32(); v != f[i] {
						t.Fatalf("%s[%d] = %g; want %g", name, i, v, f[i])
					}
				}
			case experts.Q4K:
				if !quantize || keep {
					t.Fatalf("%s quantized (--quantize %v); want it kept as F16", name, quantize)
				}
				want := make([]byte, q4k.RowBytes(len(f)))
				q4k.Quantize(want, f)
				if !bytes.Equal(got, want) {
					t.Errorf("%s: Q4_K bytes differ from quantizing the source", name)
				}
				deq := make([]float32, len(f))
				q4k.Dequantize(deq, got)
				var se, sx float64
				for i := range f {
					se += float64(deq[i]-f[i]) * float64(deq[i]-f[i])
					sx += float64(f[i]) * float64(f[i])
				}
				if rel := math.Sqrt(se / sx); rel > 0.12 {
					t.Errorf("%s: Q4_K relative RMS error %.3f; want under 0.12", name, rel)
				}
			default:
				t.Errorf("%s: dtype %s", name, mt.DType)
			}
		}
	}
}

// Names from the file are input: a layer number that overflows, an expert
// past the limit, or two tensors that map to one name are refused.
func TestConvertRefusesBadNames(t *testing.T) {
	q := make([]byte, 144)
	for name, ts := range map[string][]gguf.WriteTensor{
		"layer overflows": {{Name: "blk.99999999999999999999.ffn_gate.0.weight", Dims: []uint64{256}, Type: gguf.Q4_K, Data: q}},
		"expert too big":  {{Name: "blk.0.ffn_gate.100000.weight", Dims: []uint64{256}, Type: gguf.Q4_K, Data: q}},
		"one name twice": {
			{Name: "blk.0.ffn_gate.0.weight", Dims: []uint64{256}, Type: gguf.Q4_K, Data: q},
			{Name: "blk.0.ffn_gate_exps.weight", Dims: []uint64{256, 1, 1}, Type: gguf.Q4_K, Data: q},
		},
	} {
		dir := t.TempDir()
		in := filepath.Join(dir, "m.gguf")
		var buf bytes.Buffer
		if err := gguf.Write(&buf, []gguf.KV{{Key: "general.architecture", Value: "llama"}}, ts, 0); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(in, buf.Bytes(), 0o644)
		if _, err := Convert(context.Background(), in, filepath.Join(dir, "out"), Options{}); err == nil {
			t.Errorf("%s: converted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// Experts that fit a shard never cross one, over several 64 MiB shards; an
// expert larger than a shard (Mixtral-8x7B's are 99 MB) starts one; and
// the conversion's memory does not grow with the input (it streams):
// converting 250 MB allocates a few MiB.
func TestConvertShardsStreamAndNeverSplit(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 360 MB")
	}
	const rows, cols = 60000, 256 // 8.6 MB a matrix, 25.9 MB an expert: two fit a shard, three do not
	r := rand.New(rand.NewPCG(11, 12))
	dir := t.TempDir()
	in := filepath.Join(dir, "big.gguf")
	ts := []gguf.WriteTensor{{Name: "token_embd.weight", Dims: []uint64{cols, 7001}, Type: gguf.Q4_K, Data: randBytes(r, 7001*144)}}
	for e := 0; e < 7; e++ {
		for _, part := range []string{"gate", "up", "down"} {
			ts = append(ts, gguf.WriteTensor{Name: "blk.0.ffn_" + part + "." + itoa(e) + ".weight", Dims: []uint64{cols, rows}, Type: gguf.Q4_K, Data: randBytes(r, rows*144)})
		}
	}
	const bigRows = 170000 // 24.5 MB a matrix: a 73 MB expert
	for _, part := range []string{"gate", "up", "down"} {
		ts = append(ts, gguf.WriteTensor{Name: "blk.1.ffn_" + part + ".0.weight", Dims: []uint64{cols, bigRows}, Type: gguf.Q4_K, Data: randBytes(r, bigRows*144)})
	}
	kv := []gguf.KV{{Key: "general.architecture", Value: "llama"}, {Key: "llama.embedding_length", Value: uint32(cols)},
		{Key: "llama.block_count", Value: uint32(2)}, {Key: "llama.attention.head_count", Value: uint32(1)},
		{Key: "llama.feed_forward_length", Value: uint32(rows)}, {Key: "llama.expert_count", Value: uint32(7)},
		{Key: "llama.expert_used_count", Value: uint32(2)}, {Key: "llama.vocab_size", Value: uint32(7001)},
		{Key: "llama.attention.layer_norm_rms_epsilon", Value: float32(1e-5)}}
	f, err := os.Create(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := gguf.Write(f, kv, ts, 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := map[string][]byte{"model.embed_tokens.weight": ts[0].Data}
	for i, x := range ts[1:] {
		want[expertName(i/21, i/3%7, i%3)] = x.Data
	}
	ts = nil
	runtime.GC()

	out := filepath.Join(dir, "out")
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	m, err := Convert(context.Background(), in, out, Options{})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("Convert of %d MB allocated %d MB", m.TotalSize>>20, n>>20)
	}
	t.Logf("%d MB in %d shards, %d KiB allocated", m.TotalSize>>20, len(m.Shards), (after.TotalAlloc-before.TotalAlloc)>>10)
	if len(m.Shards) < 5 {
		t.Fatalf("%d shards; want at least 5", len(m.Shards))
	}
	for _, s := range m.Shards {
		if s.Size > experts.ShardSize {
			t.Errorf("shard %s of %d bytes", s.Filename, s.Size)
		}
	}
	for _, e := range m.Experts {
		switch {
		case e.Size > experts.ShardSize && e.Offset != 0:
			t.Errorf("layer %d expert %d of %d bytes starts at offset %d of shard %d; want a shard's start", e.Layer, e.Index, e.Size, e.Offset, e.Shard)
		case e.Size <= experts.ShardSize && e.Offset+e.Size > m.Shards[e.Shard].Size:
			t.Errorf("layer %d expert %d crosses the end of shard %d", e.Layer, e.Index, e.Shard)
		}
	}
	if big := m.Experts[len(m.Experts)-1]; big.Layer != 1 || big.Size <= experts.ShardSize {
		t.Errorf("last expert: layer %d, %d bytes; want layer 1, over a shard", big.Layer, big.Size)
	}
	for name, b := range want {
		if got := readTensor(t, out, m, name); !bytes.Equal(got, b) {
			t.Errorf("%s: converted bytes differ from the source", name)
		}
	}
}

// BenchmarkConvertQuantize converts a BF16 safetensors model of 8 expert
// matrices (32 MB) to Q4_K, with one worker and with GOMAXPROCS, and
// reports its throughput (input bytes) as a ratio of a raw read of the
// same file in the same run (warm page cache).
func BenchmarkConvertQuantize(b *testing.B) {
	for _, workers := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run("workers="+itoa(workers), func(b *testing.B) { benchmarkConvertQuantize(b, workers) })
	}
}

func benchmarkConvertQuantize(b *testing.B, workers int) {
	dir := b.TempDir()
	model := filepath.Join(dir, "model")
	os.Mkdir(model, 0o755)
	r := rand.New(rand.NewPCG(13, 14))
	const rows, cols, n = 1024, 2048, 8
	var ts []safetensors.WriteTensor
	for e := 0; e < n; e++ {
		data := make([]byte, 2*rows*cols)
		for i := 0; i < rows*cols; i++ {
			binary.LittleEndian.PutUint16(data[2*i:], uint16(math.Float32bits(float32(r.NormFloat64()*0.02))>>16))
		}
		ts = append(ts, safetensors.WriteTensor{Name: "model.layers.0.mlp.experts." + itoa(e) + ".gate_proj.weight", DType: "BF16", Shape: []uint64{rows, cols}, Data: data})
	}
	in := filepath.Join(model, "model.safetensors")
	f, _ := os.Create(in)
	safetensors.Write(f, ts, nil)
	f.Close()
	cfg := `{"model_type":"deepseek_v3","hidden_size":2048,"num_hidden_layers":1,"num_attention_heads":16,"num_key_value_heads":16,"intermediate_size":1024,
	"moe_intermediate_size":1024,"n_routed_experts":8,"num_experts_per_tok":2,"vocab_size":16,"rms_norm_eps":1e-6,"rope_theta":10000}`
	os.WriteFile(filepath.Join(model, "config.json"), []byte(cfg), 0o644)
	fi, _ := os.Stat(in)
	b.SetBytes(fi.Size())
	var raw, conv float64
	buf := make([]byte, 4<<20)
	for i := 0; i < b.N; i++ {
		t0 := nowSeconds()
		f, _ := os.Open(in)
		for {
			if _, err := f.Read(buf); err != nil {
				break
			}
		}
		f.Close()
		raw += nowSeconds() - t0
		out := filepath.Join(dir, "out"+itoa(i))
		t0 = nowSeconds()
		if _, err := Convert(context.Background(), model, out, Options{Quantize: true, Workers: workers}); err != nil {
			b.Fatal(err)
		}
		conv += nowSeconds() - t0
		os.RemoveAll(out)
	}
	b.ReportMetric(raw/conv, "x-raw-read")
}

// quantize gives the reference's bytes whatever the batches and workers:
// 4099 F32 rows of 256 are two batches, split three ways.
func TestQuantizeBatchesAndWorkers(t *testing.T) {
	const rows, cols = quantBatch/(256*4) + 3, 256
	r := rand.New(rand.NewPCG(15, 16))
	src := f32s(r, rows*cols)
	f := make([]float32, rows*cols)
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
	want := make([]byte, q4k.RowBytes(rows*cols))
	q4k.Quantize(want, f)
	for _, workers := range []int{1, 3, 7} {
		tn := &tensor{name: "x", dtype: experts.F32, out: experts.Q4K, shape: []int64{rows, cols},
			src: io.NewSectionReader(bytes.NewReader(src), 0, int64(len(src)))}
		var got bytes.Buffer
		if err := quantize(context.Background(), &got, tn, workers); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%d workers: bytes differ from q4k.Quantize", workers)
		}
	}
}
