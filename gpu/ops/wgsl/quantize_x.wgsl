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
//+ADD @group(0) @binding(2) var<storage, read_write> x: array<vec4<f32>>;
//+ADD @group(0) @binding(3) var<storage, read> w: array<vec4<f32>>;
//+ADD @group(0) @binding(4) var<storage, read_write> y: array<vec4<f32>>;
//+ADD @group(0) @binding(5) var<storage, read_write> q: array<vec4<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

//#include quantize.inc

//-NORM @compute @workgroup_size(64)
//-NORM fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
//-NORM   let g = (wid.x + wid.y * p.gx) * 64u + tid;
//-NORM   if (g >= p.groups) {
//-NORM     return;
//-NORM   }
//-NORM   quantize(array<vec4<f32>, 4>(x[4u * g], x[4u * g + 1u], x[4u * g + 2u], x[4u * g + 3u]), g);
//-NORM }

//+NORM const WG: u32 = 256u;
//+NORM var<workgroup> red: array<f32, WG>;
//+NORM
//+NORM @compute @workgroup_size(256)
//+NORM fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
//+NORM   let row = wid.x + wid.y * p.gx;
//+NORM   if (row >= p.n) {
//+NORM     return; // uniform: the whole workgroup
//+NORM   }
//+NORM   let groups = p.d / 16u;
//+NORM   let base = row * groups; // in groups; x's vec4 at 4 * group
//+NORM   var s = 0.0;
//+NORM   for (var g = tid; g < groups; g += WG) {
//+NORM     var a = x[4u * (base + g)];
//+NORM     var b = x[4u * (base + g) + 1u];
//+NORM     var c = x[4u * (base + g) + 2u];
//+NORM     var e = x[4u * (base + g) + 3u];
//+ADD     for (var j = 0u; j < min(p.k, 16u); j++) {
//+ADD       let wj = wts[p.woff + j];
//+ADD       let o = j * (p.d / 4u) + 4u * g;
//+ADD       a += wj * src[o];
//+ADD       b += wj * src[o + 1u];
//+ADD       c += wj * src[o + 2u];
//+ADD       e += wj * src[o + 3u];
//+ADD     }
//+ADD     x[4u * g] = a;
//+ADD     x[4u * g + 1u] = b;
//+ADD     x[4u * g + 2u] = c;
//+ADD     x[4u * g + 3u] = e;
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
//+NORM   let inv = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
//+NORM   for (var g = tid; g < groups; g += WG) {
//+NORM     let o = 4u * (base + g);
//+NORM     let v = array<vec4<f32>, 4>(x[o] * inv * w[4u * g], x[o + 1u] * inv * w[4u * g + 1u],
//+NORM       x[o + 2u] * inv * w[4u * g + 2u], x[o + 3u] * inv * w[4u * g + 3u]);
//+NORM     y[o] = v[0];
//+NORM     y[o + 1u] = v[1];
//+NORM     y[o + 2u] = v[2];
//+NORM     y[o + 3u] = v[3];
//+NORM     quantize(v, base + g);
//+NORM   }
//+NORM }
