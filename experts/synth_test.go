package experts

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu/q4k"
)

// fakeHashes fills the shard hashes of a layout with placeholders, for
// tests of the layout alone (hashing 380 GB takes minutes).
func fakeHashes(m *Manifest) {
	for i := range m.Shards {
		m.Shards[i].Hash = strings.Repeat("ab", 32)
	}
}

func TestPresetLayoutsValidate(t *testing.T) {
	for _, p := range Presets {
		t.Run(p.Name, func(t *testing.T) {
			lo, err := NewLayout(p, 1)
			if err != nil {
				t.Fatal(err)
			}
			m := lo.Manifest
			fakeHashes(m)
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			c := m.Config
			moe := 0
			for l := 0; l < c.NumHiddenLayers; l++ {
				if c.IsMoE(l) {
					moe++
				}
			}
			if got, want := len(m.Experts), moe*c.Experts(); got != want {
				t.Errorf("%d experts indexed; want %d", got, want)
			}
			for _, e := range m.Experts {
				if e.Size <= ShardSize && e.Offset+e.Size > m.Shards[e.Shard].Size {
					t.Fatalf("expert %d/%d crosses its shard's end", e.Layer, e.Index)
				}
			}
			t.Logf("%s: %d shards, %.1f GB, %d tensors, expert %.1f MB", p.Name, len(m.Shards), float64(m.TotalSize)/1e9, len(m.Tensors), float64(m.Experts[0].Size)/1e6)
		})
	}
}

// TestShapesOfPresets checks the sizes the perf model states.
func TestShapesOfPresets(t *testing.T) {
	for _, tc := range []struct {
		preset string
		expert int64 // bytes of one expert
	}{
		{"mixtral-8x7b", 3 * 14336 * 4096 / 256 * 144},
		{"deepseek-v3-671b", 3 * 7168 * 2048 / 256 * 144},
	} {
		p, _ := PresetByName(tc.preset)
		lo, err := NewLayout(p, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := lo.Manifest.Experts[0].Size; got != tc.expert {
			t.Errorf("%s: expert of %d bytes; want %d", tc.preset, got, tc.expert)
		}
	}
}

func TestShardBytesDeterministicAndValidQ4K(t *testing.T) {
	p, _ := PresetByName("tiny-moe")
	a, _ := NewLayout(p, 7)
	b, _ := NewLayout(p, 7)
	c, _ := NewLayout(p, 8)
	for i, s := range a.Manifest.Shards {
		x, y, z := make([]byte, s.Size), make([]byte, s.Size), make([]byte, s.Size)
		if err := a.ShardBytes(i, x); err != nil {
			t.Fatal(err)
		}
		b.ShardBytes(i, y)
		c.ShardBytes(i, z)
		if string(x) != string(y) {
			t.Fatalf("shard %d differs between two layouts of one seed", i)
		}
		if string(x) == string(z) {
			t.Fatalf("shard %d is the same for seeds 7 and 8", i)
		}
	}
	// Every Q4_K tensor decodes to finite weights of the intended scale.
	m := a.Manifest
	bufs := map[int][]byte{}
	for name, tn := range m.Tensors {
		if tn.DType != Q4K {
			continue
		}
		if bufs[tn.Shard] == nil {
			bufs[tn.Shard] = make([]byte, m.Shards[tn.Shard].Size)
			a.ShardBytes(tn.Shard, bufs[tn.Shard])
		}
		w := make([]float32, tn.Elements())
		if err := q4k.Dequantize(w, bufs[tn.Shard][tn.Offset:tn.Offset+tn.Size]); err != nil {
			t.Fatal(err)
		}
		var sum, sq float64
		for _, v := range w {
			sum += float64(v)
			sq += float64(v) * float64(v)
		}
		n := float64(len(w))
		mean, std := sum/n, sqrt(sq/n-(sum/n)*(sum/n))
		want := 1 / sqrt(float64(tn.Shape[len(tn.Shape)-1]))
		if std < want/2 || std > want*2 {
			t.Errorf("%s: std %.4g; want about %.4g", name, std, want)
		}
		if strings.Contains(name, "embed") != (mean > 0.05*std) {
			t.Errorf("%s: mean %.4g, std %.4g (only embeddings drift)", name, mean, std)
		}
	}
}

func TestWriteModelHashesMatch(t *testing.T) {
	p, _ := PresetByName("tiny-moe")
	lo, _ := NewLayout(p, 3)
	dir := t.TempDir()
	if err := lo.WriteModel(context.Background(), dir, false, nil); err != nil {
		t.Fatal(err)
	}
	mb, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(mb)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range m.Shards {
		b, err := os.ReadFile(filepath.Join(dir, s.Filename))
		if err != nil {
			t.Fatal(err)
		}
		d := cas.Sum(b).Digest()
		if got := hex.EncodeToString(d[:]); got != s.Hash {
			t.Errorf("%s hashes to %s; manifest says %s", s.Filename, got, s.Hash)
		}
	}
	// Procedural: the same manifest, no shard files.
	dir2 := t.TempDir()
	lo2, _ := NewLayout(p, 3)
	if err := lo2.WriteModel(context.Background(), dir2, true, nil); err != nil {
		t.Fatal(err)
	}
	mb2, _ := os.ReadFile(filepath.Join(dir2, ManifestFile))
	if string(mb) != string(mb2) {
		t.Error("procedural manifest differs from the written model's")
	}
	if ents, _ := os.ReadDir(dir2); len(ents) != 1 {
		t.Errorf("procedural wrote %d files; want only the manifest", len(ents))
	}
}

func sqrt(x float64) float64 { return math.Sqrt(x) }

func TestMountPlan(t *testing.T) {
	p, _ := PresetByName("deepseek-v3-671b")
	lo, _ := NewLayout(p, 1)
	m := lo.Manifest
	const gib = 1 << 30
	plan := Mount(m, Budgets{VRAM: 80 * gib, RAM: 100 * gib, Disk: 100 * gib})
	if got, want := plan.ExpertsPerToken, 58*8; got != want {
		t.Errorf("%d routed experts per token; want %d", got, want)
	}
	if got, want := plan.Experts, 58*256; got != want {
		t.Errorf("%d experts; want %d", got, want)
	}
	if plan.Resident["shared_experts"] != 58*3*7168*2048/256*144 {
		t.Errorf("shared experts resident: %d bytes", plan.Resident["shared_experts"])
	}
	if plan.Resident["dense_ffn"] != 3*3*7168*18432/256*144 {
		t.Errorf("dense FFN resident: %d bytes", plan.Resident["dense_ffn"])
	}
	sum := plan.ResidentBytes + plan.PagedBytes
	if sum != m.TotalSize {
		t.Errorf("resident %d + paged %d != total %d", plan.ResidentBytes, plan.PagedBytes, m.TotalSize)
	}
	if n := plan.ExpertSlots + plan.InRAM + plan.OnDisk + plan.FromSwarm; n != plan.Experts {
		t.Errorf("levels hold %d experts; want %d", n, plan.Experts)
	}
	if want := int((80*gib - plan.ResidentBytes) / plan.ExpertBytes); plan.ExpertSlots != want {
		t.Errorf("%d VRAM slots; want %d", plan.ExpertSlots, want)
	}
	if plan.FromSwarm == 0 || plan.OnDisk != int(100*gib/plan.ExpertBytes) {
		t.Errorf("disk %d, swarm %d", plan.OnDisk, plan.FromSwarm)
	}
	small := Mount(m, Budgets{VRAM: gib})
	if len(small.Warnings) == 0 || small.ExpertSlots != 0 {
		t.Errorf("a 1 GiB VRAM budget: %d slots, warnings %v", small.ExpertSlots, small.Warnings)
	}
}

// BenchmarkMount671B decodes and plans the 671B-shaped manifest, the work
// of `peer mount`; the baseline is reading the same bytes as plain JSON
// into an empty interface, measured in the same run.
func BenchmarkMount671B(b *testing.B) {
	p, _ := PresetByName("deepseek-v3-671b")
	lo, _ := NewLayout(p, 1)
	fakeHashes(lo.Manifest)
	mb, _ := lo.Manifest.Encode()
	b.SetBytes(int64(len(mb)))
	b.ReportAllocs()
	var base time.Duration
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		var v any
		json.Unmarshal(mb, &v)
		base += time.Since(t0)
		m, err := Decode(mb)
		if err != nil {
			b.Fatal(err)
		}
		Mount(m, Budgets{VRAM: 80 << 30})
	}
	b.ReportMetric(float64(len(mb))/1e6, "manifest-MB")
	b.ReportMetric(float64(b.Elapsed()-base)/float64(base), "x-json-unmarshal")
}
