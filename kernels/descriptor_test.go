package kernels

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/gpu"
	gpuops "github.com/rdrr/peer/gpu/ops"
)

const abiFile = "testdata/abi.json"

// Every op has a built-in baseline whose descriptor round-trips, whose
// CID is stable, and whose gpu.Kernel is the built-in kernel.
func TestBuiltins(t *testing.T) {
	bs, err := Builtins()
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Builtins()
	cids := map[cas.CID]string{}
	for _, op := range Ops() {
		a := bs[op]
		if a == nil {
			t.Fatalf("no built-in for %s", op)
		}
		if again[op].CID != a.CID {
			t.Fatalf("%s: CID %s then %s", op, a.CID, again[op].CID)
		}
		if prev, dup := cids[a.CID]; dup {
			t.Fatalf("%s and %s share CID %s", op, prev, a.CID)
		}
		cids[a.CID] = op
		d, err := DecodeDescriptor(a.Descriptor.Encode())
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if d.CID() != a.CID || d.Author != "" || d.Parent != nil {
			t.Fatalf("%s: decoded %+v", op, d)
		}
		k, err := a.Kernel()
		if err != nil {
			t.Fatal(err)
		}
		base, _ := gpuops.Builtin(ops[op].builtin, nil)
		if k.Source != base.Source || k.Params != base.Params || len(k.Bindings) != len(base.Bindings) || k.Entry != "main" {
			t.Fatalf("%s: kernel %+v is not the built-in %s", op, k, ops[op].builtin)
		}
	}
	if wg := bs["q4k_matvec"].Descriptor.Workgroup; wg != [3]uint32{256, 1, 1} {
		t.Fatalf("q4k_matvec workgroup %v (WG's default)", wg)
	}
	if c := bs["q4k_matvec_group"].Descriptor.Constants; c["GROUPED"] != 1 {
		t.Fatalf("q4k_matvec_group constants %v", c)
	}
}

// The ABI of each op (its bindings and uniform block, from gpu) matches
// the committed table: a change in gpu that alters an op's layout fails
// here until the op's ABI version is bumped and the table regenerated
// (-update).
func TestABITable(t *testing.T) {
	type abi struct {
		Version  int    `json:"version"`
		Builtin  string `json:"builtin"`
		Bindings string `json:"bindings"`
		Params   int    `json:"params"`
	}
	got := map[string]abi{}
	for op, spec := range ops {
		k, err := gpuops.Builtin(spec.builtin, nil)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, a := range k.Bindings {
			b.WriteString(a.String() + ",")
		}
		got[op] = abi{spec.abi, spec.builtin, strings.TrimSuffix(b.String(), ","), k.Params}
	}
	if *update {
		b, _ := json.MarshalIndent(got, "", "  ")
		writeGolden(t, abiFile, append(b, '\n'))
	}
	var want map[string]abi
	if err := json.Unmarshal(readGolden(t, abiFile), &want); err != nil {
		t.Fatal(err)
	}
	for op, g := range got {
		w := want[op]
		if g.Version == w.Version && g != w {
			t.Errorf("%s: layout %+v differs from the committed %+v with the same ABI version: bump it", op, g, w)
		} else if g != w {
			t.Errorf("%s: %+v; committed %+v (run -update)", op, g, w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d ops; %d committed", len(got), len(want))
	}
}

// A variant in a real store: put, load back, run as a gpu.Kernel.
func TestArtifactStore(t *testing.T) {
	ctx := context.Background()
	s, err := cas.Open(t.TempDir(), cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bs, err := RegisterBuiltins(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	for op, a := range bs {
		got, err := Load(s, a.CID)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		if !bytes.Equal(got.WGSL, a.WGSL) || got.CID != a.CID {
			t.Fatalf("%s: loaded another artifact", op)
		}
	}
	_, author := testKey(t, 1)
	parent := bs["q4k_matvec"].CID
	v, err := NewArtifact(Descriptor{Version: DescriptorVersion, Op: "q4k_matvec", ABI: 1, Entry: "main",
		Constants: map[string]float64{"ROWS": 4, "WG": 128}, Workgroup: [3]uint32{128, 1, 1},
		Parent: &parent, Author: author.String()}, bs["q4k_matvec"].WGSL)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Put(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := Load(s, v.CID)
	if err != nil {
		t.Fatal(err)
	}
	k, err := got.Kernel()
	if err != nil {
		t.Fatal(err)
	}
	if k.Constants["ROWS"] != 4 || k.Constants["WG"] != 128 || *got.Descriptor.Parent != parent {
		t.Fatalf("kernel %+v", k)
	}
	// A descriptor whose WGSL size lies is refused on load.
	lie := v.Descriptor
	lie.WGSLSize++
	if _, err := s.Put(ctx, bytes.NewReader(lie.Encode())); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(s, lie.CID()); !errors.Is(err, ErrDescriptor) {
		t.Fatalf("size lie: %v; want ErrDescriptor", err)
	}
	// Not a descriptor at all.
	info, _ := s.Put(ctx, strings.NewReader("fn main() {}"))
	if _, err := Load(s, info.CID); !errors.Is(err, ErrDescriptor) {
		t.Fatalf("WGSL as a descriptor: %v; want ErrDescriptor", err)
	}
	// Another ABI: stored and loaded, but not runnable here.
	other := v.Descriptor
	other.ABI = 2
	oa, err := NewArtifact(other, v.WGSL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oa.Kernel(); !errors.Is(err, ErrDescriptor) {
		t.Fatalf("Kernel of ABI 2: %v; want ErrDescriptor", err)
	}
}

// NewArtifact checks the WGSL against the descriptor.
func TestArtifactChecksWGSL(t *testing.T) {
	src := "override WG: u32 = 64u;\noverride ROWS: u32 = 2u;\n@compute @workgroup_size(WG, 2)\nfn go_(@builtin(local_invocation_index) i: u32) {}\n"
	ok := Descriptor{Version: DescriptorVersion, Op: "rmsnorm", ABI: 1, Entry: "go_", Workgroup: [3]uint32{64, 2, 1}}
	if _, err := NewArtifact(ok, []byte(src)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(d *Descriptor)
		src  string
	}{
		{"no entry point", func(d *Descriptor) { d.Entry = "main" }, src},
		{"workgroup differs", func(d *Descriptor) { d.Workgroup = [3]uint32{64, 1, 1} }, src},
		{"constant changes workgroup", func(d *Descriptor) { d.Constants = map[string]float64{"WG": 128} }, src},
		{"constant not an override", func(d *Descriptor) { d.Constants = map[string]float64{"TILE": 2} }, src},
		{"workgroup too big", func(d *Descriptor) {
			d.Constants, d.Workgroup = map[string]float64{"WG": 1024}, [3]uint32{1024, 2, 1}
		}, src},
		{"f16 not declared", nil, "enable f16;\n" + src},
		{"feature not enabled", func(d *Descriptor) { d.Features = []string{"shader-f16"} }, src},
		{"unknown enable", nil, "enable chromium_experimental;\n" + src},
		{"NUL byte", nil, src + "\x00"},
		{"not UTF-8", nil, src + "\xff"},
		{"no workgroup_size", nil, strings.Replace(src, "@workgroup_size(WG, 2)", "", 1)},
		{"empty", nil, ""},
		{"too big", nil, src + strings.Repeat(" ", MaxWGSLBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := ok
			if tc.mod != nil {
				tc.mod(&d)
			}
			if _, err := NewArtifact(d, []byte(tc.src)); !errors.Is(err, ErrDescriptor) {
				t.Fatalf("%v; want ErrDescriptor", err)
			}
		})
	}
	// enable f16 with the feature declared is fine.
	d := ok
	d.Features = []string{"shader-f16"}
	if _, err := NewArtifact(d, []byte("enable f16;\n"+src)); err != nil {
		t.Fatal(err)
	}
}

// DecodeDescriptor takes the canonical encoding only.
func TestDecodeDescriptorStrict(t *testing.T) {
	bs, _ := Builtins()
	good := bs["q4k_matvec_group"].Descriptor.Encode()
	if _, err := DecodeDescriptor(good); err != nil {
		t.Fatal(err)
	}
	wgsl := bs["q4k_matvec_group"].Descriptor.WGSL
	for _, tc := range []struct{ name, from, to string }{
		{"space", `,"entry"`, `, "entry"`},
		{"field order", `"abi":1,`, ``},
		{"unknown field", `"abi":1,`, `"abi":1,"x":1,`},
		{"hex CID", wgsl.String(), wgsl.Hex()},
		{"unknown op", `"op":"q4k_matvec_group"`, `"op":"mine"`},
		{"version", `"v":1`, `"v":2`},
		{"empty constants", `"constants":{"GROUPED":1}`, `"constants":{}`},
		{"constant as float", `"GROUPED":1`, `"GROUPED":1.0`},
		{"bad constant name", `"GROUPED"`, `"GR OUPED"`},
		{"huge constant", `"GROUPED":1`, `"GROUPED":1e300`},
		{"zero workgroup", `"workgroup":[256,1,1]`, `"workgroup":[0,1,1]`},
		{"workgroup too big", `"workgroup":[256,1,1]`, `"workgroup":[256,8,1]`},
		{"wgsl size", `"wgslSize":`, `"wgslSize":9`},
		{"null parent", `"op":`, `"parent":null,"op":`},
		{"unsorted features", `"entry":"main",`, `"entry":"main","features":["subgroups","shader-f16"],`},
		{"unknown feature", `"entry":"main",`, `"entry":"main","features":["timestamp-query"],`},
		{"bad author", `"abi":1,`, `"abi":1,"author":"me",`},
		{"trailing", `]}`, `]} `},
	} {
		b := bytes.Replace(good, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(b, good) {
			t.Fatalf("%s: no change", tc.name)
		}
		if _, err := DecodeDescriptor(b); !errors.Is(err, ErrDescriptor) {
			t.Errorf("%s: %v; want ErrDescriptor", tc.name, err)
		}
	}
}

func FuzzDescriptor(f *testing.F) {
	bs, err := Builtins()
	if err != nil {
		f.Fatal(err)
	}
	for _, a := range bs {
		f.Add(a.Descriptor.Encode())
	}
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDescriptor(b)
		if err != nil {
			if !errors.Is(err, ErrDescriptor) {
				t.Fatalf("error %v does not wrap ErrDescriptor", err)
			}
			return
		}
		if !bytes.Equal(d.Encode(), b) || d.CID() != cas.Sum(b) {
			t.Fatal("decoded descriptor re-encodes differently")
		}
	})
}

func TestBucket(t *testing.T) {
	for _, tc := range []struct {
		op   string
		dims []int
		want string
	}{
		{"q4k_matvec", []int{4000, 14000}, "4096x16384"},
		{"attention_decode", []int{32, 8, 128, 3000}, "32x8x128x4096"},
		{"route_topk", []int{1, 256, 6}, "1x256x8"},
		{"argmax", []int{1}, "1"},
	} {
		got, err := Bucket(tc.op, tc.dims...)
		if err != nil || got != tc.want {
			t.Errorf("Bucket(%s, %v) = %q, %v; want %q", tc.op, tc.dims, got, err, tc.want)
		}
		if err := checkBucket(tc.op, got); err != nil {
			t.Errorf("checkBucket(%s, %q): %v", tc.op, got, err)
		}
	}
	for _, bad := range []struct {
		op   string
		dims []int
	}{{"q4k_matvec", []int{4096}}, {"q4k_matvec", []int{0, 4096}}, {"nope", []int{1}}, {"argmax", []int{MaxDim + 1}}} {
		if _, err := Bucket(bad.op, bad.dims...); err == nil {
			t.Errorf("Bucket(%s, %v) succeeded", bad.op, bad.dims)
		}
	}
	for _, bad := range []string{"4096", "4096x16384x1", "4096x016384", "4096x16383", "4096x0", "4096x", "x4096", "4096x4294967296"} {
		if checkBucket("q4k_matvec", bad) == nil {
			t.Errorf("checkBucket accepted %q", bad)
		}
	}
}

func TestDeviceClass(t *testing.T) {
	info := gpu.AdapterInfo{Backend: gpu.Backend(0), VendorID: 0x10de, DeviceID: 0x2330, Driver: "580.95.05 (NVIDIA Corp.)"}
	c := ClassOf(info)
	if c.Vendor != "10de" || c.Device != "2330" {
		t.Fatalf("class %+v", c)
	}
	if !strings.HasSuffix(c.Exact(), "/10de/2330/580.95.05-nvidia-corp.") || !strings.HasPrefix(c.Exact(), c.Coarse()+"/") {
		t.Fatalf("exact %q coarse %q", c.Exact(), c.Coarse())
	}
	// Whatever the adapter says, the class is in the charset Decode
	// accepts, and bounded.
	odd := DeviceClass{Backend: "Vulkan", Vendor: "", Device: "<script>", Driver: strings.Repeat("é1", 100)}
	e := Endorsement{Class: odd.Exact(), Coarse: odd.Coarse()}
	if !coarseRE.MatchString(e.Coarse) || len(e.Class) > 4*49 {
		t.Fatalf("class %q coarse %q", e.Class, e.Coarse)
	}
	if odd.Coarse() != "vulkan/unknown/script" {
		t.Fatalf("coarse %q", odd.Coarse())
	}
}
