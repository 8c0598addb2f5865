// Decode attention: one query token over kv_len cached positions, grouped
// query heads. q [n_heads][hd]; k and v [max_len][n_kv][hd] (row stride
// n_kv*hd); out [n_heads][hd]. One workgroup per head walks the cache in
// tiles of 256 positions with an online softmax: scores of a tile (one
// position per thread), then the tile's weighted values (one dimension per
// thread). hd <= 256.

struct Params {
  n_heads: u32,
  n_kv: u32,
  hd: u32,
  kv_len: u32,
  scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> o: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const NEG: f32 = -3.0e38;
var<workgroup> qs: array<f32, WG>;
var<workgroup> sc: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let h = wid.x;
  let kvh = h / (p.n_heads / p.n_kv);
  let stride = p.n_kv * p.hd;
  if (tid < p.hd) {
    qs[tid] = q[h * p.hd + tid];
  }
  var m = NEG;   // running max
  var l = 0.0;   // running sum of exp
  var acc = 0.0; // output dimension tid
  for (var t0 = 0u; t0 < p.kv_len; t0 += WG) {
    workgroupBarrier();
    let t = t0 + tid;
    var s = NEG;
    if (t < p.kv_len) {
      let kb = t * stride + kvh * p.hd;
      var dot = 0.0;
      for (var i = 0u; i < p.hd; i++) {
        dot += qs[i] * k[kb + i];
      }
      s = dot * p.scale;
    }
    red[tid] = s;
    for (var st = WG >> 1u; st > 0u; st >>= 1u) {
      workgroupBarrier();
      if (tid < st) {
        red[tid] = max(red[tid], red[tid + st]);
      }
    }
    workgroupBarrier();
    let mn = max(m, red[0]);
    workgroupBarrier();
    var e = 0.0;
    if (t < p.kv_len) {
      e = exp(s - mn);
    }
    sc[tid] = e;
    red[tid] = e;
    for (var st = WG >> 1u; st > 0u; st >>= 1u) {
      workgroupBarrier();
      if (tid < st) {
        red[tid] += red[tid + st];
      }
    }
    workgroupBarrier();
    let alpha = exp(m - mn);
    l = l * alpha + red[0];
    m = mn;
    if (tid < p.hd) {
      let n = min(WG, p.kv_len - t0);
      var a = acc * alpha;
      for (var i = 0u; i < n; i++) {
        a += sc[i] * v[(t0 + i) * stride + kvh * p.hd + tid];
      }
      acc = a;
    }
  }
  if (tid < p.hd) {
    o[h * p.hd + tid] = acc / l;
  }
}
