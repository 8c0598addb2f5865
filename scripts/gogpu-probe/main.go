// Command gogpu-probe measures, on another WebGPU implementation
// (gogpu/wgpu: pure Go, its own WGSL compiler, a port of naga that has
// the packed 8-bit dot product our bundled naga v22 lacks), what the
// decode step's Q4_K products of quantized x would gain from that
// instruction:
//
//   - a copy kernel (the bandwidth every ratio is against, in this run);
//   - our own q4k_matmul_xq, as the op library launches it (cases.json,
//     written by scripts/gogpu-cases), so that the runtime and compiler
//     are compared with ours on the same kernel;
//   - q4k_dot4 (below): the same product with x as packed 8-bit values,
//     4 weights a dot4I8Packed, at the same shapes;
//
// each dispatch in its own pass (a barrier after each, as the step runs
// them), medians of 5 batches, weights rotated beyond the L2. First it
// checks q4k_dot4 against a float64 reference. It is a separate module
// (CGO_ENABLED=0, as gogpu/wgpu asks), not part of the peer.
//
//	cd scripts/gogpu-probe && CGO_ENABLED=0 go build -o /tmp/probe . && /tmp/probe [-n 100]
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gogpu/gputypes"
	"github.com/gogpu/naga"
	"github.com/gogpu/wgpu"
	_ "github.com/gogpu/wgpu/hal/allbackends"
)

// Case and Binding are the JSON that scripts/gogpu-cases writes (its
// types, repeated: the two programs are separate modules, the peer's with
// cgo and this one without).
type Case struct {
	Name     string    `json:"name"`
	Source   string    `json:"source"`
	Groups   [3]uint32 `json:"groups"`
	Params   []byte    `json:"params"`
	Bindings []Binding `json:"bindings"`
	Bytes    uint64    `json:"bytes"`
}

type Binding struct {
	Bytes uint64 `json:"bytes"`
	RW    bool   `json:"rw"`
}

var dev *wgpu.Device

func main() {
	n := flag.Int("n", 100, "dispatches a batch")
	casesFile := flag.String("cases", "cases.json", "scripts/gogpu-cases' output")
	only := flag.String("only", "", "run only cases whose name contains this")
	exact := flag.String("case", "", "run only the case of this name (one process a case: gogpu/wgpu v0.20.0 slows down after many buffers)")
	sweep := flag.Bool("sweep", false, "also q4k_dot4 in other layouts (workgroup, block slots, rows)")
	spv := flag.String("spv", "", "write q4k_dot4's and the copy kernel's SPIR-V (gogpu/naga) to FILE.dot4.spv and FILE.copy.spv, and exit")
	dump := flag.Bool("dump", false, "print q4k_dot4's and pair4's WGSL (4096x4096) and exit")
	flag.Parse()
	if *dump {
		fmt.Println(dot4Case(4096, 4096, 128, 4, 2).Source)
		fmt.Println(pair4Case(4096, 4096, 128, 4, 2).Source)
		return
	}
	if *spv != "" {
		for name, src := range map[string]string{"dot4": dot4Case(4096, 4096, 128, 4, 2).Source, "copy": copyCase(16).Source} {
			b, err := naga.Compile(src)
			if err != nil {
				log.Fatalf("%s: %v", name, err)
			}
			if err := os.WriteFile(*spv+"."+name+".spv", b, 0o644); err != nil {
				log.Fatal(err)
			}
		}
		return
	}
	inst, err := wgpu.CreateInstance(nil)
	if err != nil {
		log.Fatal(err)
	}
	ad, err := inst.RequestAdapter(&wgpu.RequestAdapterOptions{PowerPreference: wgpu.PowerPreferenceHighPerformance})
	if err != nil {
		ad, err = inst.RequestAdapter(nil) // a CPU adapter
	}
	if err != nil {
		log.Fatal(err)
	}
	lim := ad.Limits()
	fmt.Printf("adapter: %s (max buffer %d MiB, binding %d MiB)\n", ad.Info().Name, lim.MaxBufferSize>>20, lim.MaxStorageBufferBindingSize>>20)
	dev, err = ad.RequestDevice(&wgpu.DeviceDescriptor{RequiredLimits: lim})
	if err != nil {
		log.Fatal(err)
	}
	if err := checkDot4(); err != nil {
		log.Fatal(err)
	}
	copySize := min(uint64(256<<20), lim.MaxStorageBufferBindingSize/16*16)
	cp := copyCase(copySize)
	cpPer := timeCase(cp, *n)
	bw := float64(cp.Bytes) / cpPer.Seconds()
	fmt.Printf("copy %d MiB: %.2f us, %.0f GB/s\n", copySize>>20, us(cpPer), bw/1e9)
	b, err := os.ReadFile(*casesFile)
	if err != nil {
		log.Fatal(err)
	}
	var cases []Case
	if err := json.Unmarshal(b, &cases); err != nil {
		log.Fatal(err)
	}
	for _, c := range cases {
		c.Source = nagaFixups(c.Source)
		var rows, cols int
		fmt.Sscanf(c.Name, "xq/%dx%d", &rows, &cols)
		// xqc: the same kernel with the block slots a row (params word 2)
		// a literal instead of a uniform, so that no division or modulo
		// by it is left for run time.
		xc := c
		xc.Name = "xqc" + strings.TrimPrefix(c.Name, "xq")
		xc.Source = strings.ReplaceAll(c.Source, "p.spr", fmt.Sprintf("%du", binary.LittleEndian.Uint32(c.Params[8:])))
		ks := []Case{c, xc, dot4Case(rows, cols, 128, 4, 4), pair4Case(rows, cols, 128, 4, 4)}
		if *sweep {
			for _, l := range [][3]int{{128, 2, 4}, {128, 8, 4}, {128, 16, 4}, {128, 2, 8}, {128, 4, 8}, {128, 8, 8}, {256, 4, 4}, {256, 8, 4}, {64, 4, 4}, {128, 4, 2}} {
				for _, mk := range []func(int, int, int, int, int) Case{dot4Case, pair4Case} {
					k := mk(rows, cols, l[0], l[1], l[2])
					k.Name += fmt.Sprintf("/%d-%d-%d", l[0], l[1], l[2])
					ks = append(ks, k)
				}
			}
		}
		for _, k := range ks {
			if *only != "" && !strings.Contains(k.Name, *only) || *exact != "" && k.Name != *exact {
				continue
			}
			per := timeCase(k, *n)
			fmt.Printf("%-22s %8.2f us  %.3f of copy\n", k.Name, us(per), float64(k.Bytes)/per.Seconds()/bw)
		}
	}
}

// nagaFixups rewrites what gogpu/naga's WGSL front end does not take yet
// into what it does, the same values: a constant vector built of
// expressions (q4k_matmul's XS, POS 1), written as its literals.
func nagaFixups(src string) string {
	return strings.NewReplacer(
		"const XS: vec4<f32> = vec4<f32>(1.0, 1.0 - f32(POS) * 0.99609375, 1.0 - f32(POS) * 0.9999847412109375, 1.0 - f32(POS) * 0.9999847412109375);",
		"const XS: vec4<f32> = vec4<f32>(1.0, 0.00390625, 0.0000152587890625, 0.0000152587890625); // POS 1",
	).Replace(src)
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// copyCase copies n bytes as vec4s, a grid-stride loop.
func copyCase(n uint64) Case {
	src := `
@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<u32>>;
struct P { n: u32, threads: u32, _a: u32, _b: u32 }
@group(1) @binding(0) var<uniform> p: P;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  for (var i = g.x; i < p.n; i += p.threads) {
    b[i] = a[i];
  }
}`
	const wgs = 132 * 16
	params := binary.LittleEndian.AppendUint32(nil, uint32(n/16))
	params = binary.LittleEndian.AppendUint32(params, wgs*256)
	params = append(params, make([]byte, 8)...)
	return Case{Name: "copy", Source: src, Groups: [3]uint32{wgs, 1, 1}, Params: params,
		Bindings: []Binding{{n, false}, {n, true}}, Bytes: 2 * n}
}

// pipe is a case made ready: its pipeline, and bind groups over rotated
// copies of binding 0.
type pipe struct {
	l0, l1 *wgpu.BindGroupLayout
	pl     *wgpu.ComputePipeline
	groups []*wgpu.BindGroup
	params *wgpu.BindGroup
	bufs   []*wgpu.Buffer
}

// compile makes c's pipeline and its bind group layouts.
func compile(c Case) *pipe {
	sm, err := dev.CreateShaderModule(&wgpu.ShaderModuleDescriptor{Label: c.Name, WGSL: c.Source})
	if err != nil {
		log.Fatalf("%s: shader: %v", c.Name, err)
	}
	var ents []wgpu.BindGroupLayoutEntry
	for i, b := range c.Bindings {
		t := gputypes.BufferBindingTypeReadOnlyStorage
		if b.RW {
			t = gputypes.BufferBindingTypeStorage
		}
		ents = append(ents, wgpu.BindGroupLayoutEntry{Binding: uint32(i), Visibility: wgpu.ShaderStageCompute, Buffer: &gputypes.BufferBindingLayout{Type: t}})
	}
	l0, err := dev.CreateBindGroupLayout(&wgpu.BindGroupLayoutDescriptor{Label: c.Name, Entries: ents})
	if err != nil {
		log.Fatal(err)
	}
	l1, err := dev.CreateBindGroupLayout(&wgpu.BindGroupLayoutDescriptor{Label: c.Name + " params", Entries: []wgpu.BindGroupLayoutEntry{
		{Binding: 0, Visibility: wgpu.ShaderStageCompute, Buffer: &gputypes.BufferBindingLayout{Type: gputypes.BufferBindingTypeUniform}}}})
	if err != nil {
		log.Fatal(err)
	}
	pll, err := dev.CreatePipelineLayout(&wgpu.PipelineLayoutDescriptor{BindGroupLayouts: []*wgpu.BindGroupLayout{l0, l1}})
	if err != nil {
		log.Fatal(err)
	}
	pl, err := dev.CreateComputePipeline(&wgpu.ComputePipelineDescriptor{Label: c.Name, Layout: pll, Module: sm, EntryPoint: "main"})
	if err != nil {
		log.Fatalf("%s: pipeline: %v", c.Name, err)
	}
	return &pipe{pl: pl, l0: l0, l1: l1}
}

// build is compile and c's buffers: binding 0 rotated over copies (fill
// nil: random bytes everywhere, weights beyond the L2), else one set that
// fill writes.
func build(c Case, fill func(i int, b []byte)) *pipe {
	p := compile(c)
	ub := buffer(uint64(len(c.Params)), wgpu.BufferUsageUniform|wgpu.BufferUsageCopyDst)
	write(ub, c.Params)
	var err error
	p.params, err = dev.CreateBindGroup(&wgpu.BindGroupDescriptor{Layout: p.l1, Entries: []wgpu.BindGroupEntry{{Binding: 0, Buffer: ub, Size: uint64(len(c.Params))}}})
	if err != nil {
		log.Fatal(err)
	}
	// Binding 0 rotated over 256 MiB at least (the L2 is 50-60 MB).
	rot := 1
	if fill == nil {
		rot = int(min(max((256<<20+c.Bindings[0].Bytes-1)/c.Bindings[0].Bytes, 2), 16))
	}
	var rest []*wgpu.Buffer
	for i, b := range c.Bindings[1:] {
		data := make([]byte, b.Bytes)
		if fill != nil {
			fill(i+1, data)
		} else {
			randBytes(data)
		}
		rest = append(rest, deviceBuffer(data))
	}
	for range rot {
		data := make([]byte, c.Bindings[0].Bytes)
		if fill != nil {
			fill(0, data)
		} else {
			randBytes(data)
		}
		w := deviceBuffer(data)
		all := append([]*wgpu.Buffer{w}, rest...)
		var es []wgpu.BindGroupEntry
		for i, b := range all {
			es = append(es, wgpu.BindGroupEntry{Binding: uint32(i), Buffer: b, Size: c.Bindings[i].Bytes})
		}
		g, err := dev.CreateBindGroup(&wgpu.BindGroupDescriptor{Layout: p.l0, Entries: es})
		if err != nil {
			log.Fatal(err)
		}
		p.groups = append(p.groups, g)
		p.bufs = append(p.bufs, w)
	}
	p.bufs = append(p.bufs, rest...)
	return p
}

// deviceBuffer returns a buffer in the GPU's own memory holding data.
// gogpu/wgpu v0.20.0 puts every buffer a copy may write (CopyDst) in
// host-visible memory, which the GPU reads at ~80 GB/s on an H200: so
// data goes into a host buffer, and a kernel copies it into one that is
// only Storage and CopySrc.
func deviceBuffer(data []byte) *wgpu.Buffer {
	n := uint64(len(data)+15) / 16 * 16
	host := buffer(n, wgpu.BufferUsageStorage|wgpu.BufferUsageCopyDst)
	write(host, data)
	dst := buffer(n, wgpu.BufferUsageStorage|wgpu.BufferUsageCopySrc)
	if fillPipe == nil {
		fillPipe = compile(copyCase(16))
	}
	fc := copyCase(n)
	ub := buffer(uint64(len(fc.Params)), wgpu.BufferUsageUniform|wgpu.BufferUsageCopyDst)
	write(ub, fc.Params)
	g, err := dev.CreateBindGroup(&wgpu.BindGroupDescriptor{Layout: fillPipe.l0, Entries: []wgpu.BindGroupEntry{{Binding: 0, Buffer: host, Size: n}, {Binding: 1, Buffer: dst, Size: n}}})
	if err != nil {
		log.Fatal(err)
	}
	pg, err := dev.CreateBindGroup(&wgpu.BindGroupDescriptor{Layout: fillPipe.l1, Entries: []wgpu.BindGroupEntry{{Binding: 0, Buffer: ub, Size: uint64(len(fc.Params))}}})
	if err != nil {
		log.Fatal(err)
	}
	record(fillPipe.pl, []*wgpu.BindGroup{g}, pg, fc.Groups, 1)
	g.Release()
	pg.Release()
	ub.Release()
	host.Release()
	return dst
}

var fillPipe *pipe

func buffer(n uint64, usage wgpu.BufferUsage) *wgpu.Buffer {
	b, err := dev.CreateBuffer(&wgpu.BufferDescriptor{Size: (n + 15) / 16 * 16, Usage: usage})
	if err != nil {
		log.Fatalf("buffer of %d: %v", n, err)
	}
	return b
}

func write(b *wgpu.Buffer, data []byte) {
	for off := 0; off < len(data); off += 16 << 20 {
		end := min(off+16<<20, len(data))
		if err := dev.Queue().WriteBuffer(b, uint64(off), data[off:end]); err != nil {
			log.Fatal(err)
		}
	}
}

var rng = rand.New(rand.NewPCG(1, 2))

func randBytes(b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
}

// run records n dispatches of p, each in its own pass, submits them and
// waits for them.
func (p *pipe) run(c Case, n int) time.Duration {
	return record(p.pl, p.groups, p.params, c.Groups, n)
}

// record records n dispatches of pl over grid, each in its own pass (a
// barrier after each) with bind group i % len(g0) and the params' g1,
// submits them and returns the time from submission to the GPU's idle.
func record(pl *wgpu.ComputePipeline, g0 []*wgpu.BindGroup, g1 *wgpu.BindGroup, grid [3]uint32, n int) time.Duration {
	enc, err := dev.CreateCommandEncoder(nil)
	if err != nil {
		log.Fatal(err)
	}
	for i := range n {
		pass, err := enc.BeginComputePass(nil)
		if err != nil {
			log.Fatal(err)
		}
		pass.SetPipeline(pl)
		pass.SetBindGroup(0, g0[i%len(g0)], nil)
		pass.SetBindGroup(1, g1, nil)
		pass.Dispatch(grid[0], grid[1], grid[2])
		if err := pass.End(); err != nil {
			log.Fatal(err)
		}
	}
	cb, err := enc.Finish()
	if err != nil {
		log.Fatal(err)
	}
	t := time.Now()
	if err := dev.Queue().Submit(cb); err != nil {
		log.Fatal(err)
	}
	if err := dev.WaitIdle(); err != nil {
		log.Fatal(err)
	}
	return time.Since(t)
}

// timeCase is the median over 5 batches of n dispatches of a dispatch's
// time, after a batch of warm-up.
func timeCase(c Case, n int) time.Duration {
	p := build(c, nil)
	p.run(c, n)
	var ts []time.Duration
	for range 5 {
		ts = append(ts, p.run(c, n)/time.Duration(n))
	}
	slices.Sort(ts)
	for _, b := range p.bufs {
		b.Release()
	}
	return ts[2]
}

// dot4Source is q4k_dot4: y = W x for Q4_K rows (9 vec4 a block: the
// header, then 8 vec4 of quants) and x as 8-bit integers, 4 to a word
// in order (16 vec4 a block), times a float scale a group of 16 (xs).
// Thread c of a block's 8 takes quant vec4 c: 16 low nibbles of
// sub-block 2j and 16 high nibbles of sub-block 2j+1 (j = c / 2) at
// positions 16 (c & 1) on; each word's nibbles masked to four bytes and
// one dot4I8Packed with four x values. The scales and mins as
// q4k_xq.inc decodes them (pairs). ROWS rows a thread, SPR block slots a
// row, the next block's loads issued before this block's arithmetic.
const dot4Source = `
struct P { rows: u32, nb: u32, _a: u32, _b: u32 }
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: P;

const WG: u32 = WGu;
const ROWS: u32 = ROWSu;
const SPR: u32 = SPRu;
const M: u32 = 0x0f0f0f0fu;
const ONES: u32 = 0x01010101u;

const RED: u32 = WG * ROWS;
var<workgroup> red: array<f32, RED>;

struct Sel { lo: bool, s_sc: u32, s_m: u32, mask: u32, s_hi: u32, m_hi: u32 }

fn selector(j: u32) -> Sel {
  let lo = j < 2u;
  let i = 2u * j;
  let k = (i - 4u) & 7u;
  var s: Sel;
  s.lo = lo;
  s.s_sc = select(8u * k, 8u * i, lo);
  s.s_m = select(8u * k + 4u, 8u * i, lo);
  s.mask = select(15u, 63u, lo);
  s.s_hi = select(8u * k + 2u, 0u, lo);
  s.m_hi = select(0x30u, 0u, lo);
  return s;
}

fn tofloat(v: vec4<u32>) -> vec4<f32> {
  return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

// (sc0, 256 sc1, m0, 256 m1) of sub-blocks 2j and 2j + 1.
fn pairs(h: vec4<u32>, s: Sel) -> vec4<f32> {
  let a_sc = select(h.w, h.y, s.lo);
  let a_m = select(h.w, h.z, s.lo);
  let mask = select(0x0f0fu, 0x3f3fu, s.lo);
  let m_hi = select(0x3030u, 0u, s.lo);
  let tsc = ((a_sc >> s.s_sc) & mask) | ((h.y >> s.s_hi) & m_hi);
  let tm = ((a_m >> s.s_m) & mask) | ((h.z >> s.s_hi) & m_hi);
  return tofloat(vec4<u32>(tsc, tsc, tm, tm) & vec4<u32>(0x3fu, 0x3f00u, 0x3fu, 0x3f00u));
}

// A signed integer below 2^22 in magnitude as a float, no conversion.
fn itof(i: i32) -> f32 {
  return bitcast<f32>(bitcast<u32>(i) + 0x4b400000u) - 12582912.0;
}

fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {
  return dot4I8Packed(q.x & M, x.x) + dot4I8Packed(q.y & M, x.y) + dot4I8Packed(q.z & M, x.z) + dot4I8Packed(q.w & M, x.w);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let c = tid & 7u;
  let slot = (tid >> 3u) % SPR;
  let grp = (tid >> 3u) / SPR;
  let j = c >> 1u;
  let half = c & 1u;
  let s = selector(j);
  let row0 = (wid.x * (WG / 8u / SPR) + grp) * ROWS;
  let nb = p.nb;
  var acc: array<f32, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    acc[r] = 0.0;
  }
  var pre_h: array<vec4<u32>, ROWS>;
  var pre_q: array<vec4<u32>, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    let blk = (min(row0 + r, p.rows - 1u) * nb + slot) * 9u;
    pre_h[r] = w[blk];
    pre_q[r] = w[blk + 1u + c];
  }
  for (var b = slot; b < nb; b += SPR) {
    let bn = min(b + SPR, nb - 1u);
    let gl = b * 16u + 4u * j + half;
    let xl = xq[gl];
    let xh = xq[gl + 2u];
    let sl = xs[gl];
    let sh = xs[gl + 2u] * 0.00390625;
    var hs = pre_h;
    var qs = pre_q;
    for (var r = 0u; r < ROWS; r++) {
      let nblk = (min(row0 + r, p.rows - 1u) * nb + bn) * 9u;
      pre_h[r] = w[nblk];
      pre_q[r] = w[nblk + 1u + c];
    }
    let suml = sl * itof(dot16(vec4<u32>(ONES), xl));
    let sumh = sh * itof(dot16(vec4<u32>(ONES), xh));
    for (var r = 0u; r < ROWS; r++) {
      let h = hs[r];
      let q = qs[r];
      let dm = unpack2x16float(h.x);
      let sm = pairs(h, s);
      let il = itof(dot16(q, xl));
      let ih = itof(dot16(q >> vec4<u32>(4u), xh));
      acc[r] += dm.x * (sm.x * sl * il + sm.y * sh * ih) - dm.y * (sm.z * suml + sm.w * sumh);
    }
  }
  let seg = 8u * SPR;
  for (var r = 0u; r < ROWS; r++) {
    red[r * WG + tid] = acc[r];
  }
  for (var st = seg >> 1u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if ((tid & (seg - 1u)) < st) {
      for (var r = 0u; r < ROWS; r++) {
        red[r * WG + tid] += red[r * WG + tid + st];
      }
    }
  }
  if ((tid & (seg - 1u)) == 0u) {
    for (var r = 0u; r < ROWS; r++) {
      if (row0 + r < p.rows) {
        y[row0 + r] = red[r * WG + tid];
      }
    }
  }
}
`

// pair4Source is q4k_dot4's kernel with our arithmetic instead of the
// packed dot product: x in QuantizeX's form (three vec4 a group of 16:
// the pairs' words, then the scale and the scaled sum) and q4k_xq.inc's
// pairsum, two weights a 32-bit multiply-add. Against q4k_dot4 it isolates
// the instruction; against our q4k_matmul_xq, the kernel's skeleton (x
// read in its round, not a block ahead; fewer registers).
var pair4Source = strings.NewReplacer(
	"@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;\n@group(0) @binding(2) var<storage, read> xs: array<f32>;\n@group(0) @binding(3) var<storage, read_write> y: array<f32>;",
	"@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;\n@group(0) @binding(2) var<storage, read_write> y: array<f32>;",
	`    let gl = b * 16u + 4u * j + half;
    let xl = xq[gl];
    let xh = xq[gl + 2u];
    let sl = xs[gl];
    let sh = xs[gl + 2u] * 0.00390625;`,
	`    let gl = (b * 16u + 4u * j + half) * 3u;
    let a0 = x[gl];
    let a1 = x[gl + 1u];
    let ml = bitcast<vec4<f32>>(x[gl + 2u]);
    let b0 = x[gl + 6u];
    let b1 = x[gl + 7u];
    let mh = bitcast<vec4<f32>>(x[gl + 8u]) * 0.00390625;`,
	`    let suml = sl * itof(dot16(vec4<u32>(ONES), xl));
    let sumh = sh * itof(dot16(vec4<u32>(ONES), xh));
`, "",
	`      let il = itof(dot16(q, xl));
      let ih = itof(dot16(q >> vec4<u32>(4u), xh));
      acc[r] += dm.x * (sm.x * sl * il + sm.y * sh * ih) - dm.y * (sm.z * suml + sm.w * sumh);`,
	`      let lo = pairsum(q, a0, a1);
      let hi = pairsum(q >> vec4<u32>(4u), b0, b1);
      acc[r] += dm.x * (sm.x * ml.x * lo + sm.y * mh.x * hi) - dm.y * (sm.z * ml.y + sm.w * mh.y);`,
	`fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {`,
	`fn pairsum(q: vec4<u32>, a: vec4<u32>, b: vec4<u32>) -> f32 {
  let PM = vec4<u32>(0x000f000fu);
  let s = 0x8000u + dot(q & PM, a) + dot((q >> vec4<u32>(8u)) & PM, b);
  let h = bitcast<i32>(s) >> 16u;
  return bitcast<f32>(bitcast<u32>(h) + 0x4b400000u) - 12582912.0;
}

fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {`,
).Replace(dot4Source)

func pair4Case(rows, cols, wg, spr, nrows int) Case {
	c := dot4Case(rows, cols, wg, spr, nrows)
	c.Name = "pair4" + strings.TrimPrefix(c.Name, "dot4")
	c.Source = strings.NewReplacer("WGu", fmt.Sprint(wg)+"u", "ROWSu", fmt.Sprint(nrows)+"u", "SPRu", fmt.Sprint(spr)+"u").Replace(pair4Source)
	xb := uint64(cols / 16 * 48)
	wb := c.Bindings[0].Bytes
	c.Bindings = []Binding{{wb, false}, {xb, false}, {uint64(rows * 4), true}}
	c.Bytes = wb + xb + uint64(rows*4)
	return c
}

func dot4Case(rows, cols, wg, spr, nrows int) Case {
	src := strings.NewReplacer("WGu", fmt.Sprint(wg)+"u", "ROWSu", fmt.Sprint(nrows)+"u", "SPRu", fmt.Sprint(spr)+"u").Replace(dot4Source)
	perWG := wg / 8 / spr * nrows
	params := binary.LittleEndian.AppendUint32(nil, uint32(rows))
	params = binary.LittleEndian.AppendUint32(params, uint32(cols/256))
	params = append(params, make([]byte, 8)...)
	wb := uint64(rows * cols / 256 * 144)
	return Case{Name: fmt.Sprintf("dot4/%dx%d", rows, cols), Source: src, Groups: [3]uint32{uint32((rows + perWG - 1) / perWG), 1, 1}, Params: params,
		Bindings: []Binding{{wb, false}, {uint64(cols), false}, {uint64(cols / 16 * 4), false}, {uint64(rows * 4), true}},
		Bytes:    wb + uint64(cols) + uint64(cols/16*4) + uint64(rows*4)}
}

// checkDot4 runs q4k_dot4 on random blocks and compares it with a float64
// product of the same quantized values.
func checkDot4() error {
	const rows, cols = 48, 1024
	nb := cols / 256
	w := make([]byte, rows*nb*144)
	for blk := range rows * nb {
		b := w[blk*144:]
		binary.LittleEndian.PutUint16(b, f16(0.01+0.02*rng.Float64()))
		binary.LittleEndian.PutUint16(b[2:], f16(0.005+0.01*rng.Float64()))
		for i := 4; i < 144; i++ {
			b[i] = byte(rng.IntN(256))
		}
	}
	xq := make([]byte, cols)
	xs := make([]byte, cols/16*4)
	xv := make([]float64, cols)
	for g := range cols / 16 {
		sc := float32(0.01 + 0.05*rng.Float64())
		binary.LittleEndian.PutUint32(xs[g*4:], math.Float32bits(sc))
		for i := range 16 {
			v := int8(rng.IntN(255) - 127)
			xq[g*16+i] = byte(v)
			xv[g*16+i] = float64(sc) * float64(v)
		}
	}
	want := make([]float64, rows)
	for r := range rows {
		for b := range nb {
			blk := w[(r*nb+b)*144:]
			d, dmin := unf16(binary.LittleEndian.Uint16(blk)), unf16(binary.LittleEndian.Uint16(blk[2:]))
			scb, qs := blk[4:16], blk[16:144]
			for sb := range 8 {
				sc, m := scaleMin(scb, sb)
				for i := range 32 {
					q := qs[32*(sb/2)+i]
					if sb%2 == 1 {
						q >>= 4
					}
					want[r] += (d*float64(sc)*float64(q&15) - dmin*float64(m)) * xv[b*256+sb*32+i]
				}
			}
		}
	}
	c := dot4Case(rows, cols, 128, 4, 4)
	c.Bindings[0].Bytes = uint64(len(w))
	p := build(c, func(i int, b []byte) {
		switch i {
		case 0:
			copy(b, w)
		case 1:
			copy(b, xq)
		case 2:
			copy(b, xs)
		}
	})
	p.run(c, 1)
	st := buffer(rows*4, wgpu.BufferUsageMapRead|wgpu.BufferUsageCopyDst)
	enc, _ := dev.CreateCommandEncoder(nil)
	enc.CopyBufferToBuffer(p.bufs[len(p.bufs)-1], 0, st, 0, rows*4)
	cb, _ := enc.Finish()
	if err := dev.Queue().Submit(cb); err != nil {
		return err
	}
	out := make([]byte, rows*4)
	if err := dev.Queue().ReadBuffer(st, 0, out); err != nil {
		return err
	}
	worst := 0.0
	for r := range rows {
		got := float64(math.Float32frombits(binary.LittleEndian.Uint32(out[r*4:])))
		e := math.Abs(got-want[r]) / (1e-3 + math.Abs(want[r]))
		worst = max(worst, e)
		if e > 1e-4 || math.IsNaN(got) {
			return fmt.Errorf("q4k_dot4: y[%d] = %v; want %v", r, got, want[r])
		}
	}
	fmt.Printf("q4k_dot4 matches the float64 reference (%d x %d, worst relative error %.2g)\n", rows, cols, worst)
	return nil
}

// scaleMin is ggml's get_scale_min_k4.
func scaleMin(q []byte, j int) (byte, byte) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

func f16(v float64) uint16 {
	// Normal halves only (the values here are 0.005-0.03).
	b := math.Float32bits(float32(v))
	exp := int(b>>23&0xff) - 127 + 15
	return uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

func unf16(h uint16) float64 {
	exp := int(h>>10&0x1f) - 15
	return math.Ldexp(1+float64(h&0x3ff)/1024, exp)
}
