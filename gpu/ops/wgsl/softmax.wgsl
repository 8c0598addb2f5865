// Softmax of each row of d, one workgroup per row.

struct Params {
  n: u32,
  d: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
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
  var m = -3.0e38;
  for (var i = tid; i < p.d; i += WG) {
    m = max(m, x[base + i]);
  }
  red[tid] = m;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      red[tid] = max(red[tid], red[tid + s]);
    }
  }
  workgroupBarrier();
  m = red[0];
  workgroupBarrier();
  var sum = 0.0;
  for (var i = tid; i < p.d; i += WG) {
    sum += exp(x[base + i] - m);
  }
  red[tid] = sum;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      red[tid] += red[tid + s];
    }
  }
  workgroupBarrier();
  let inv = 1.0 / red[0];
  for (var i = tid; i < p.d; i += WG) {
    y[base + i] = exp(x[base + i] - m) * inv;
  }
}
