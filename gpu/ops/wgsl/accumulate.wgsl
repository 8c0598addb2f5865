// Weighted accumulate of expert outputs: dst[i] += sum_j w[w_off + j] *
// src[j*d + i] for j < k. The weights come straight from the routing
// kernel's output, so no readback sits between routing and combining.

struct Params {
  d: u32,
  k: u32,
  w_off: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> wt: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let i = (wid.x + wid.y * p.gx) * 256u + tid;
  if (i >= p.d) {
    return;
  }
  var s = dst[i];
  for (var j = 0u; j < p.k; j++) {
    s += wt[p.w_off + j] * src[j * p.d + i];
  }
  dst[i] = s;
}
