// Weighted accumulate of expert outputs: dst[i] += sum_j w[w_off + j] *
// src[j*d + i] for j < k. The weights come straight from the routing
// kernel's output, so no readback sits between routing and combining.
//
// The NORM flavor (accumulate_norm) also hands the RMSNorm of the new dst
// to the products that read it (q4k_matmul's and dense_matmul's PART):
// xg = dst * g (the norm's weight) and, per workgroup, the sum of dst^2
// over its elements into part[workgroup]. k may be 0 (dst as it is).

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
//+NORM @group(0) @binding(3) var<storage, read> g: array<f32>;
//+NORM @group(0) @binding(4) var<storage, read_write> xg: array<f32>;
//+NORM @group(0) @binding(5) var<storage, read_write> part: array<f32>;
//+NORM var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let wg = wid.x + wid.y * p.gx;
  let i = wg * 256u + tid;
  var s = 0.0;
  if (i < p.d) {
    s = dst[i];
    for (var j = 0u; j < p.k; j++) {
      s += wt[p.w_off + j] * src[j * p.d + i];
    }
    dst[i] = s;
//+NORM    xg[i] = s * g[i];
  }
//+NORM  red[tid] = s * s; // 0 past d
//+NORM  for (var h = 128u; h > 0u; h >>= 1u) {
//+NORM    workgroupBarrier();
//+NORM    if (tid < h) {
//+NORM      red[tid] += red[tid + h];
//+NORM    }
//+NORM  }
//+NORM  if (tid == 0u) {
//+NORM    part[wg] = red[0];
//+NORM  }
}
