// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, one workgroup per row of d.

struct Params {
  n: u32,
  d: u32,
  eps: f32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let row = wid.x + wid.y * p.gx;
  if (row >= p.n) {
    return;
  }
  let base = row * p.d;
  var ss = 0.0;
  for (var i = tid; i < p.d; i += WG) {
    let v = x[base + i];
    ss += v * v;
  }
  red[tid] = ss;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      red[tid] += red[tid + s];
    }
  }
  workgroupBarrier();
  let inv = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
  for (var i = tid; i < p.d; i += WG) {
    y[base + i] = x[base + i] * inv * w[i];
  }
}
