package experts

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// tinyManifest returns a valid tiny-moe manifest (placeholder hashes).
func tinyManifest(t testing.TB) *Manifest {
	t.Helper()
	p, _ := PresetByName("tiny-moe")
	lo, err := NewLayout(p, 1)
	if err != nil {
		t.Fatal(err)
	}
	fakeHashes(lo.Manifest)
	if err := lo.Manifest.Validate(); err != nil {
		t.Fatal(err)
	}
	return lo.Manifest
}

// Each rule of FORMAT.md, broken once: the error names the field.
func TestValidateErrorsNameTheField(t *testing.T) {
	emb := "model.embed_tokens.weight"
	norm := "model.norm.weight"
	for _, tc := range []struct {
		name   string
		break_ func(m *Manifest)
		field  string
	}{
		{"hash algorithm", func(m *Manifest) { m.HashAlgorithm = "sha256" }, "hashAlgorithm"},
		{"unknown dtype", func(m *Manifest) { m.Tensors[norm].DType = "Q8_0" }, `tensors["model.norm.weight"].dtype`},
		{"shape size mismatch", func(m *Manifest) { m.Tensors[norm].Shape = []int64{255} }, `tensors["model.norm.weight"].size`},
		{"q4k row not whole blocks", func(m *Manifest) { m.Tensors[emb].Shape = []int64{1024, 128} }, `tensors["model.embed_tokens.weight"].shape`},
		{"zero dimension", func(m *Manifest) { m.Tensors[norm].Shape = []int64{0} }, `tensors["model.norm.weight"].shape`},
		{"too many dimensions", func(m *Manifest) { m.Tensors[norm].Shape = []int64{1, 1, 1, 1, 256} }, `tensors["model.norm.weight"].shape`},
		{"overflowing shape", func(m *Manifest) { m.Tensors[norm].Shape = []int64{1 << 32, 1 << 32, 1 << 32} }, `tensors["model.norm.weight"].shape`},
		{"missing shard", func(m *Manifest) { m.Tensors[norm].Shard = 3 }, `tensors["model.norm.weight"].shard`},
		{"tensor outside its shard", func(m *Manifest) { m.Tensors[norm].Offset = m.Shards[0].Size }, `tensors["model.norm.weight"].offset`},
		{"tensor past the end", func(m *Manifest) { m.Tensors[norm].Offset = m.Shards[0].Size - 4 }, `tensors["model.norm.weight"].size`},
		{"overlapping tensors", func(m *Manifest) { m.Tensors[norm].Offset = m.Tensors[emb].Offset + 144 }, "overlaps"},
		{"hash not 32 bytes", func(m *Manifest) { m.Shards[0].Hash = "abcd" }, "shards[0].hash"},
		{"hash not hex", func(m *Manifest) { m.Shards[0].Hash = strings.Repeat("zz", 32) }, "shards[0].hash"},
		{"totals do not add up", func(m *Manifest) { m.TotalSize++ }, "totalSize"},
		{"shard too large", func(m *Manifest) { m.Shards[0].Size = ShardSize + 1 }, "shards[0].size"},
		{"path in filename", func(m *Manifest) { m.Shards[0].Filename = "../x" }, "shards[0].filename"},
		{"no shards", func(m *Manifest) { m.Shards = nil }, "shards"},
		{"expert split", func(m *Manifest) {
			// Move the expert's down matrix elsewhere: no longer one range.
			e := m.Experts[0]
			m.Tensors[e.Tensors[2]].Offset = m.Tensors[emb].Offset
			delete(m.Tensors, emb)
		}, "experts[0].tensors"},
		{"expert size", func(m *Manifest) { m.Experts[0].Size-- }, "experts[0].size"},
		{"expert unknown tensor", func(m *Manifest) { m.Experts[0].Tensors[0] = "nope" }, "experts[0].tensors"},
		{"expert twice", func(m *Manifest) { m.Experts[1].Index = m.Experts[0].Index }, "experts[1]"},
		{"expert index", func(m *Manifest) { m.Experts[0].Index = 8 }, "experts[0].expert"},
		{"expert layer", func(m *Manifest) { m.Experts[0].Layer = 4 }, "experts[0].layer"},
		{"top-k above experts", func(m *Manifest) { m.Config.NumExpertsPerTok = 9 }, "config.num_experts_per_tok"},
		{"kv heads", func(m *Manifest) { m.Config.NumKeyValueHeads = 3 }, "config.num_key_value_heads"},
		{"layers", func(m *Manifest) { m.Config.NumHiddenLayers = MaxLayers + 1 }, "config.num_hidden_layers"},
		{"expert width", func(m *Manifest) { m.Config.MoEIntermediateSize = 1 << 40 }, "config.moe_intermediate_size"},
		{"negative expert width", func(m *Manifest) { m.Config.MoEIntermediateSize = -256 }, "config.moe_intermediate_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tinyManifest(t)
			tc.break_(m)
			err := m.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate: %v; want a *FieldError", err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %q", err, tc.field)
			}
		})
	}
}

// An expert that fits a shard but crosses a shard's end is refused.
func TestExpertSplitAcrossShards(t *testing.T) {
	m := tinyManifest(t)
	// Cut the one shard in two between the first expert's gate and up
	// matrices: every tensor lies inside a shard, the expert does not.
	e := m.Experts[0]
	cut := e.Offset + m.Tensors[e.Tensors[0]].Size
	s0 := m.Shards[0]
	m.Shards = []ShardInfo{{Filename: "a", Size: cut, Hash: s0.Hash}, {Filename: "b", Size: s0.Size - cut, Hash: s0.Hash}}
	for _, tn := range m.Tensors {
		if tn.Offset >= cut {
			tn.Shard, tn.Offset = 1, tn.Offset-cut
		}
	}
	for i := range m.Experts {
		if m.Experts[i].Offset >= cut {
			m.Experts[i].Shard, m.Experts[i].Offset = 1, m.Experts[i].Offset-cut
		}
	}
	err := m.Validate()
	if err == nil || !strings.Contains(err.Error(), "split across shards") {
		t.Fatalf("Validate: %v; want an expert split across shards", err)
	}
}

func TestDecodeStrict(t *testing.T) {
	m := tinyManifest(t)
	b, err := m.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"unknown field":  strings.Replace(string(b), `"modelId"`, `"modelID2": 1, "modelId"`, 1),
		"trailing data":  string(b) + "{}",
		"not json":       "{",
		"tensor unknown": strings.Replace(string(b), `"dtype"`, `"dtypo": 1, "dtype"`, 1),
	} {
		if _, err := Decode([]byte(bad)); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := Decode(make([]byte, MaxManifestBytes+1)); err == nil {
		t.Error("an oversized manifest decoded")
	}
}

// The example in FORMAT.md's testdata parses and validates.
func TestExampleManifest(t *testing.T) {
	b, err := os.ReadFile("testdata/example-manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.Experts() != 2 || len(m.Experts) != 2 {
		t.Errorf("example: %d experts per layer, %d indexed; want 2 and 2", m.Config.Experts(), len(m.Experts))
	}
}

func FuzzManifest(f *testing.F) {
	b, _ := tinyManifest(f).Encode()
	f.Add(b)
	if ex, err := os.ReadFile("testdata/example-manifest.json"); err == nil {
		f.Add(ex)
	}
	f.Add([]byte(`{"tensors":{"a":{"shape":[1e18,1e18]}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		// What decodes re-encodes and decodes to an equal manifest.
		b2, err := m.Encode()
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Decode(b2)
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v", err)
		}
		b3, _ := m2.Encode()
		if string(b2) != string(b3) {
			t.Fatal("encoding is not stable")
		}
		for _, e := range m.Experts {
			if rs := m.Ranges(e.Shard, e.Offset, e.Size); len(rs) == 0 {
				t.Fatal("an expert has no ranges")
			}
		}
	})
}

// Expert finds every entry, through Validate's index and, once the
// entries move, by its scan.
func TestExpertLookup(t *testing.T) {
	m, _ := presetInStore(t, "tiny-deepseek", 1)
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	check := func() {
		t.Helper()
		for i := range m.Experts {
			e := &m.Experts[i]
			if got, ok := m.Expert(e.Layer, e.Index); !ok || got != e {
				t.Fatalf("layer %d expert %d: got %v, %v", e.Layer, e.Index, got, ok)
			}
		}
		if _, ok := m.Expert(0, m.Config.Experts()); ok {
			t.Fatal("an expert past the last was found")
		}
	}
	check()
	n := len(m.Experts)
	m.Experts[0], m.Experts[n-1] = m.Experts[n-1], m.Experts[0] // the index is now stale
	check()
}
