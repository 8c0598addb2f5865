package lab

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/gpu/ops"
	"github.com/rdrr/peer/kernels"
)

// An edit turns an op's built-in WGSL into another variant: each old
// string must occur in the built-in (so the test fails, rather than
// passes for nothing, when the built-in changes), and is replaced by new.
type edit struct{ old, new string }

// opVariants are, per op harnessed after the first four, variants made
// by editing the built-in: cheaters (wrong, each in its own way) that the
// gate must refuse, and a correct rewrite (another order of the same
// arithmetic, FMA contraction, another split of the work) that it must
// pass.
var opVariants = map[string]struct {
	cheaters map[string][]edit
	correct  []edit
}{
	"accumulate": {
		cheaters: map[string][]edit{
			"skips the last partial workgroup": {{"if (i < p.d) {", "if (i < p.d / 256u * 256u || p.d < 256u) {"}},
			"ignores the weights' offset":      {{"wt[p.w_off + j]", "wt[j]"}},
		},
		correct: []edit{{"for (var j = 0u; j < p.k; j++) {\n      s += wt[p.w_off + j] * src[j * p.d + i];",
			"for (var j = p.k; j > 0u; j--) {\n      s = fma(wt[p.w_off + j - 1u], src[(j - 1u) * p.d + i], s);"}},
	},
	"embed": {
		cheaters: map[string][]edit{
			"every token gets the first token's row": {{"let e = ids[t] * p.d + i;", "let e = ids[0] * p.d + i;"}},
		},
		correct: []edit{{"let e = ids[t] * p.d + i;", "let e = i + ids[g / p.d] * p.d;"}},
	},
	"attention_decode": {
		cheaters: map[string][]edit{
			"ignores the last position":  {{"live && t0 + pi < p.kv_len", "live && t0 + pi + 1u < p.kv_len"}},
			"reads the first cache head": {{"let kb = (t * stride + j * hd) >> 2u;", "let kb = (t * stride) >> 2u;"}},
		},
		correct: []edit{{"dots[g] += dot(q4(g, i), kv);", "dots[g] = dots[g] + dot(kv, q4(g, i));"}},
	},
	"dense_matmul": {
		cheaters: map[string][]edit{
			"skips the last row":                        {{"if (row < p.rows && tt < p.n) {", "if (row + 1u < p.rows && tt < p.n) {"}},
			"drops columns past 256 on the scalar path": {{"for (var k = tid; k < p.cols; k += WG) {", "for (var k = tid; k < min(p.cols, 256u); k += WG) {"}},
		},
		correct: []edit{{"acc[r * TOK + t] += dot(bitcast<vec4<f32>>(wv), xa[t]);",
			"let pv = bitcast<vec4<f32>>(wv) * xa[t];\n            acc[r * TOK + t] += (pv.x + pv.y) + (pv.z + pv.w);"}},
	},
	"q4k_dequant": {
		cheaters: map[string][]edit{
			"leaves out the mins":              {{"let v0 = d0 * lo - vec4<f32>(m0);", "let v0 = d0 * lo;"}},
			"skips the last partial workgroup": {{"if (blk >= p.blocks) {", "if (blk >= p.blocks / 32u * 32u && p.blocks >= 32u) {\n    return;\n  }\n  if (blk >= p.blocks) {"}},
		},
		correct: []edit{{"let v0 = d0 * lo - vec4<f32>(m0);\n    let v1 = d1 * hi - vec4<f32>(m1);",
			"let v0 = fma(vec4<f32>(d0), lo, -vec4<f32>(m0));\n    let v1 = fma(vec4<f32>(d1), hi, -vec4<f32>(m1));"}},
	},
	"q4k_matvec": {
		cheaters: map[string][]edit{
			"leaves out the mins": {{"acc[r] += dm.x * (sm.x * dl + sm.y * dh) - dm.y * dot(sm.zw, xsum2);", "acc[r] += dm.x * (sm.x * dl + sm.y * dh);"}},
			"skips the last row":  {{"if (row < p.rows && tt < p.n) {", "if (row + 1u < p.rows && tt < p.n) {"}},
		},
		correct: q4kRewrite,
	},
	"q4k_matmul": {
		cheaters: map[string][]edit{
			"leaves out the mins":       {{"acc[r * TOK + t] += dm.x * (sm.x * dl + sm.y * dh) - dm.y * dot(sm.zw, xsum);", "acc[r * TOK + t] += dm.x * (sm.x * dl + sm.y * dh);"}},
			"skips the last token tile": {{"if (row < p.rows && tt < p.n) {", "if (row < p.rows && tt < p.n && (wid.z + 1u) * TOK < p.n + 1u) {"}},
		},
		correct: q4kRewrite,
	},
	"q4k_matvec_group": {
		cheaters: map[string][]edit{
			"ignores the slot table": {{"let wbase = select(0u, p.slots[e >> 2u][e & 3u] * p.wstride, grouped);", "let wbase = select(0u, e * p.wstride, grouped);"}},
			"ignores a shared x":     {{"let xbase = select(0u, at * p.xstride, grouped);", "let xbase = select(0u, at * p.nb * 64u, grouped);"}},
		},
		correct: q4kRewrite,
	},
	"route_topk": {
		cheaters: map[string][]edit{
			"ties to the higher index": {{"return v > bv || (v == bv && i < bi);", "return v > bv || (v == bv && i > bi);"}},
			"ignores the routed scale": {{"weights[tok * kSel() + j] = base[c] / sum * p.scale;", "weights[tok * kSel() + j] = base[c] / sum;"}},
		},
		correct: []edit{{"weights[tok * kSel() + j] = base[c] / sum * p.scale;", "weights[tok * kSel() + j] = base[c] * (p.scale / sum);"}},
	},
	"topp": {
		cheaters: map[string][]edit{
			"always the last kept token":  {{"let r = workgroupUniformLoad(&pbv);", "let r = NONE;\n  _ = workgroupUniformLoad(&pbv);"}},
			"always the first kept token": {{"let goal = p.u * (f32(st.z) / FX);", "let goal = 0.0;"}},
		},
		correct: []edit{{"return exp(x * p.inv_temp - m) * inv_z;", "return exp(fma(x, p.inv_temp, -m)) * inv_z;"}},
	},
	"rope": {
		cheaters: map[string][]edit{
			"ignores the start position": {{"let ang = f32(p.pos0 + t) * freqs[i];", "let ang = f32(t) * freqs[i];"}},
			"always NeoX pairs":          {{"if (p.style == 1u) {", "if (false) {"}},
		},
		correct: []edit{{"x[ia] = a * c - b * s;\n  x[ib] = a * s + b * c;", "x[ia] = fma(a, c, -(b * s));\n  x[ib] = fma(a, s, b * c);"}},
	},
}

// q4kRewrite sums a block's terms into the accumulators in another order,
// with FMA (both paths of q4k_matmul.wgsl: matrix-vector and small
// batch).
var q4kRewrite = []edit{
	{"acc[r] += dm.x * (sm.x * dl + sm.y * dh) - dm.y * dot(sm.zw, xsum2);",
		"acc[r] = fma(dm.x, sm.x * dl + sm.y * dh, acc[r] - dm.y * dot(sm.zw, xsum2));"},
	{"acc[r * TOK + t] += dm.x * (sm.x * dl + sm.y * dh) - dm.y * dot(sm.zw, xsum);",
		"acc[r * TOK + t] = fma(dm.x, sm.x * dl + sm.y * dh, acc[r * TOK + t] - dm.y * dot(sm.zw, xsum));"},
}

// editVariant applies edits to op's built-in WGSL.
func editVariant(t *testing.T, op string, edits []edit) *kernels.Artifact {
	t.Helper()
	k, err := ops.Builtin(kernels.BuiltinOf(op), nil)
	if err != nil {
		t.Fatal(err)
	}
	src := k.Source
	for _, e := range edits {
		if !strings.Contains(src, e.old) {
			t.Fatalf("%s's built-in has no %q any more: update the test", op, e.old)
		}
		src = strings.Replace(src, e.old, e.new, 1)
	}
	a, err := kernels.NewVariant(op, []byte(src), "", builtins(t)[op].Descriptor.Constants, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Every op of kernels.Ops() has a harness, a default shape the op's
// bucket takes, and gate shapes.
func TestEveryOpHarnessed(t *testing.T) {
	if got, want := Ops(), kernels.Ops(); !slices.Equal(got, want) {
		t.Fatalf("lab ops %v; kernels ops %v", got, want)
	}
	for _, op := range Ops() {
		if _, err := kernels.Bucket(op, DefaultShape(op)...); err != nil {
			t.Errorf("%s default shape %v: %v", op, DefaultShape(op), err)
		}
		if h := harnesses[op]; len(h.gateShapes) < 5 {
			t.Errorf("%s: %d gate shapes", op, len(h.gateShapes))
		}
	}
	for op := range opVariants {
		if _, ok := harnesses[op]; !ok {
			t.Errorf("variants of %s, which has no harness", op)
		}
	}
}

// Each op's default shape makes a problem (the tests time smaller ones:
// testShape), and a shape of the wrong rank is refused.
func TestDefaultShapesMake(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the references of the default shapes")
	}
	for _, op := range Ops() {
		r := seeded(1, op, "test")
		p, err := harnesses[op].make(r, DefaultShape(op))
		if err != nil {
			t.Errorf("%s %v: %v", op, DefaultShape(op), err)
			continue
		}
		if p.bytes <= 0 || len(p.binds) == 0 || len(p.steps) == 0 || p.steps[0].groups[0] == 0 {
			t.Errorf("%s %v: %d bytes, %d bindings, dispatches %v", op, DefaultShape(op), p.bytes, len(p.binds), p.steps)
		}
		if _, err := harnesses[op].make(r, append(DefaultShape(op), 1)); err == nil {
			t.Errorf("%s: a shape of %d dimensions made a problem", op, len(DefaultShape(op))+1)
		}
	}
}

// The gate refuses each op's cheaters and passes its correct rewrite.
func TestOpVariants(t *testing.T) {
	l := &Lab{Dev: testDev}
	for _, op := range slices.Sorted(maps.Keys(opVariants)) {
		vs := opVariants[op]
		t.Run(op, func(t *testing.T) {
			for what, edits := range vs.cheaters {
				t.Run(what, func(t *testing.T) {
					_, err := l.Check(ctxT(t, 2*time.Minute), editVariant(t, op, edits), 5)
					if !errors.Is(err, kernels.ErrGate) {
						t.Fatalf("cheater passed the gate (%v)", err)
					}
					t.Logf("refused: %v", err)
				})
			}
			t.Run("correct", func(t *testing.T) {
				v := editVariant(t, op, vs.correct)
				if v.CID == builtins(t)[op].CID {
					t.Fatal("the rewrite is the built-in")
				}
				if _, err := l.Check(ctxT(t, 2*time.Minute), v, 6); err != nil {
					t.Fatalf("correct rewrite refused: %v", err)
				}
			})
		})
	}
}
