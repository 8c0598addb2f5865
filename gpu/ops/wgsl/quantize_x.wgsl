// Quantize x for the Q4_K products' XQ flavor (q4k_matmul.wgsl, load_xq):
// each group of 16 values becomes 16 integers in [-127, 127] and a scale
// (the group's largest magnitude / 127), written as three vec4: the
// pairs' first words, v(4k+2) + 65536 v(4k), their second words, v(4k+3)
// + 65536 v(4k+1) (two's complement, k = 0..3), and (scale, the sum of
// the group's quantized values times the scale, 0, 0). One thread a
// group. ref.QuantizeX gives the values on the CPU.
//
// The NORM flavor (kernel rmsnorm_xq) is an RMSNorm that hands its output
// over quantized as well: y = x / sqrt(mean(x^2) + eps) * w, one
// workgroup a row of d values, each thread a group of 16 in turn; the
// norm's output need not be read back by a dispatch of its own.
//
// The NORM ADD flavor (kernel accumulate_rmsnorm_xq) first adds the
// residual: x += sum_j wts[woff + j] * src[j * d ..] for j < k (the
// accumulate kernel's sum, in its order), writes x, and normalizes the
// new x: the accumulate after a layer's o or expert products and the
// norm that follows it in one dispatch (one row).
//
// The NORM ADD OUT flavor (kernel accumulate_rmsnorm_xq_out) reads x and
// writes the new x to xo instead: the same bits, x left as it was. A
// decode step's FFN norm writes a buffer no dispatch before it in the
// step used, so that it needs no barrier behind the dispatch recorded
// before it (the router, which reads x: route_mv_norm).

struct Params {
//-NORM  groups: u32,
//-NORM  gx: u32,
//+NORM  n: u32,
//+NORM  d: u32,
//+NORM  eps: f32,
//+NORM  gx: u32,
//+ADD  k: u32,
//+ADD  woff: u32,
//+ADD  _p0: u32,
//+ADD  _p1: u32,
}

//-ADD @group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
//-NORM @group(0) @binding(1) var<storage, read_write> q: array<vec4<u32>>;
//+NORM //-ADD @group(0) @binding(1) var<storage, read> w: array<vec4<f32>>;
//+NORM //-ADD @group(0) @binding(2) var<storage, read_write> y: array<vec4<f32>>;
//+NORM //-ADD @group(0) @binding(3) var<storage, read_write> q: array<vec4<u32>>;
//+ADD @group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
//+ADD @group(0) @binding(1) var<storage, read> wts: array<f32>;
//+ADD //-OUT @group(0) @binding(2) var<storage, read_write> x: array<vec4<f32>>;
//+OUT @group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
//+OUT @group(0) @binding(6) var<storage, read_write> xo: array<vec4<f32>>;
//+ADD @group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;
//+ADD @group(0) @binding(4) var<storage, read_write> y: array<vec4<f32>>;
//+ADD @group(0) @binding(5) var<storage, read_write> q: array<vec4<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

//#include quantize.inc

// put writes vec4 i of the new x (ADD): into x, or (OUT) xo; cur reads
// it back (x, or OUT xo).
//+ADD //-OUT fn put(i: u32, v: vec4<f32>) { x[i] = v; }
//+OUT fn put(i: u32, v: vec4<f32>) { xo[i] = v; }
//-OUT fn cur(i: u32) -> vec4<f32> { return x[i]; }
//+OUT fn cur(i: u32) -> vec4<f32> { return xo[i]; }

//-NORM @compute @workgroup_size(64)
//-NORM fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
//-NORM   let g = (wid.x + wid.y * p.gx) * 64u + tid;
//-NORM   if (g >= p.groups) {
//-NORM     return;
//-NORM   }
//-NORM   quantize(array<vec4<f32>, 4>(x[4u * g], x[4u * g + 1u], x[4u * g + 2u], x[4u * g + 3u]), g);
//-NORM }

//+NORM const WG: u32 = 256u;
//+NORM // The row's values (DIM) and (ADD) the rows added (KADD) where the
//+NORM // rule sets them, so that a decode step's one-row path and its loop
//+NORM // over the added rows fold; 0: the params', at run time.
//+NORM override DIM: u32 = 0u;
//+NORM fn dim() -> u32 { return select(p.d, DIM, DIM != 0u); }
//+ADD override KADD: u32 = 0u;
//+ADD fn kAdd() -> u32 { return select(p.k, KADD, KADD != 0u); }
//+NORM var<workgroup> red: array<f32, WG>;
//+NORM const GS: u32 = 16u; // total's first level
//+NORM const NG: u32 = 16u; // WG / GS
//+NORM var<workgroup> red2: array<f32, NG>;
//+NORM
//+NORM // total is the sum of v over the workgroup in two barriers (rmsnorm.wgsl's).
//+NORM fn total(tid: u32, v: f32) -> f32 {
//+NORM   red[tid] = v;
//+NORM   workgroupBarrier();
//+NORM   if (tid < NG) {
//+NORM     var t = 0.0;
//+NORM     for (var i = 0u; i < GS; i++) {
//+NORM       t += red[tid * GS + i];
//+NORM     }
//+NORM     red2[tid] = t;
//+NORM   }
//+NORM   workgroupBarrier();
//+NORM   var s = 0.0;
//+NORM   for (var i = 0u; i < NG; i++) {
//+NORM     s += red2[i];
//+NORM   }
//+NORM   return s;
//+NORM }
//+NORM
//+ADD // added is group g's 16 values of x, v, plus the weighted rows: v +
//+ADD // sum_j wts[woff + j] * src[j * d ..] in order of j (the accumulate
//+ADD // kernel's sum), the rows' loads two at a time.
//+ADD fn added(g: u32, v: array<vec4<f32>, 4>) -> array<vec4<f32>, 4> {
//+ADD   var a = v[0];
//+ADD   var b = v[1];
//+ADD   var c = v[2];
//+ADD   var e = v[3];
//+ADD   let kk = min(kAdd(), 16u);
//+ADD   let d4 = dim() / 4u;
//+ADD   var j = 0u;
//+ADD   for (; j + 1u < kk; j += 2u) {
//+ADD     let wa = wts[p.woff + j];
//+ADD     let wb = wts[p.woff + j + 1u];
//+ADD     let oa = j * d4 + 4u * g;
//+ADD     let ob = oa + d4;
//+ADD     let a0 = src[oa];
//+ADD     let a1 = src[oa + 1u];
//+ADD     let a2 = src[oa + 2u];
//+ADD     let a3 = src[oa + 3u];
//+ADD     let b0 = src[ob];
//+ADD     let b1 = src[ob + 1u];
//+ADD     let b2 = src[ob + 2u];
//+ADD     let b3 = src[ob + 3u];
//+ADD     a += wa * a0;
//+ADD     b += wa * a1;
//+ADD     c += wa * a2;
//+ADD     e += wa * a3;
//+ADD     a += wb * b0;
//+ADD     b += wb * b1;
//+ADD     c += wb * b2;
//+ADD     e += wb * b3;
//+ADD   }
//+ADD   if (j < kk) {
//+ADD     let wa = wts[p.woff + j];
//+ADD     let oa = j * d4 + 4u * g;
//+ADD     a += wa * src[oa];
//+ADD     b += wa * src[oa + 1u];
//+ADD     c += wa * src[oa + 2u];
//+ADD     e += wa * src[oa + 3u];
//+ADD   }
//+ADD   return array<vec4<f32>, 4>(a, b, c, e);
//+ADD }
//+NORM
//+NORM // one is main for rows of at most WG groups (a decode step's 4096
//+NORM // values: one group a thread), its row's chain of latencies short:
//+NORM // x, w and (ADD) the added rows loaded together (the added rows two at a
//+NORM // time), kept in registers through the sum (not read back from x), and
//+NORM // the sum in two barriers instead of a tree of eight. The same
//+NORM // arithmetic in the same order as the loop below, but the sum's.
//+NORM fn one(tid: u32, groups: u32, base: u32) {
//+NORM   let live = tid < groups;
//+NORM   let g = min(tid, groups - 1u);
//+NORM   let o = 4u * (base + g);
//+NORM   // Threads past the row's groups read nothing of x (ADD: the last
//+NORM   // group's thread writes it); their loads of w and src are of the last
//+NORM   // group, read-only, and their sums are dropped.
//+NORM   var a = vec4<f32>(0.0);
//+NORM   var b = a;
//+NORM   var c = a;
//+NORM   var e = a;
//+NORM   if (live) {
//+NORM     a = x[o];
//+NORM     b = x[o + 1u];
//+NORM     c = x[o + 2u];
//+NORM     e = x[o + 3u];
//+NORM   }
//+NORM   let w0 = w[4u * g];
//+NORM   let w1 = w[4u * g + 1u];
//+NORM   let w2 = w[4u * g + 2u];
//+NORM   let w3 = w[4u * g + 3u];
//+ADD   let v = added(g, array<vec4<f32>, 4>(a, b, c, e));
//+ADD   a = v[0];
//+ADD   b = v[1];
//+ADD   c = v[2];
//+ADD   e = v[3];
//+ADD   if (live) {
//+ADD     put(4u * g, a);
//+ADD     put(4u * g + 1u, b);
//+ADD     put(4u * g + 2u, c);
//+ADD     put(4u * g + 3u, e);
//+ADD   }
//+NORM   let s = select(0.0, dot(a, a) + dot(b, b) + dot(c, c) + dot(e, e), live);
//+NORM   let inv = 1.0 / sqrt(total(tid, s) / f32(dim()) + p.eps);
//+NORM   if (live) {
//+NORM     let v = array<vec4<f32>, 4>(a * inv * w0, b * inv * w1, c * inv * w2, e * inv * w3);
//+NORM     y[o] = v[0];
//+NORM     y[o + 1u] = v[1];
//+NORM     y[o + 2u] = v[2];
//+NORM     y[o + 3u] = v[3];
//+NORM     quantize(v, base + g);
//+NORM   }
//+NORM }
//+NORM
//+NORM @compute @workgroup_size(256)
//+NORM fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
//+NORM   let row = wid.x + wid.y * p.gx;
//+NORM   if (row >= p.n) {
//+NORM     return; // uniform: the whole workgroup
//+NORM   }
//+NORM   let groups = dim() / 16u;
//+NORM   let base = row * groups; // in groups; x's vec4 at 4 * group
//+NORM   if (groups <= WG) {
//+NORM     one(tid, groups, base);
//+NORM     return;
//+NORM   }
//+NORM   var s = 0.0;
//+NORM   for (var g = tid; g < groups; g += WG) {
//+NORM     var a = x[4u * (base + g)];
//+NORM     var b = x[4u * (base + g) + 1u];
//+NORM     var c = x[4u * (base + g) + 2u];
//+NORM     var e = x[4u * (base + g) + 3u];
//+ADD     let v = added(g, array<vec4<f32>, 4>(a, b, c, e));
//+ADD     a = v[0];
//+ADD     b = v[1];
//+ADD     c = v[2];
//+ADD     e = v[3];
//+ADD     put(4u * g, a);
//+ADD     put(4u * g + 1u, b);
//+ADD     put(4u * g + 2u, c);
//+ADD     put(4u * g + 3u, e);
//+NORM     s += dot(a, a) + dot(b, b) + dot(c, c) + dot(e, e);
//+NORM   }
//+NORM   red[tid] = s;
//+NORM   for (var k = WG / 2u; k > 0u; k >>= 1u) {
//+NORM     workgroupBarrier();
//+NORM     if (tid < k) {
//+NORM       red[tid] += red[tid + k];
//+NORM     }
//+NORM   }
//+NORM   workgroupBarrier();
//+NORM   let inv = 1.0 / sqrt(red[0] / f32(dim()) + p.eps);
//+NORM   for (var g = tid; g < groups; g += WG) {
//+NORM     let o = 4u * (base + g);
//+NORM     let v = array<vec4<f32>, 4>(cur(o) * inv * w[4u * g], cur(o + 1u) * inv * w[4u * g + 1u],
//+NORM       cur(o + 2u) * inv * w[4u * g + 2u], cur(o + 3u) * inv * w[4u * g + 3u]);
//+NORM     y[o] = v[0];
//+NORM     y[o + 1u] = v[1];
//+NORM     y[o + 2u] = v[2];
//+NORM     y[o + 3u] = v[3];
//+NORM     quantize(v, base + g);
//+NORM   }
//+NORM }
