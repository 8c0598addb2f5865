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
  // Four loads in flight per thread: a row of a decode step is one
  // workgroup's whole work, so its time is the loads' latency.
  var s0 = 0.0;
  var s1 = 0.0;
  var s2 = 0.0;
  var s3 = 0.0;
  var i = tid;
  for (; i + 3u * WG < p.d; i += 4u * WG) {
    let a = x[base + i];
    let b = x[base + i + WG];
    let c = x[base + i + 2u * WG];
    let e = x[base + i + 3u * WG];
    s0 += a * a;
    s1 += b * b;
    s2 += c * c;
    s3 += e * e;
  }
  for (; i < p.d; i += WG) {
    let v = x[base + i];
    s0 += v * v;
  }
  red[tid] = (s0 + s1) + (s2 + s3);
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      red[tid] += red[tid + s];
    }
  }
  workgroupBarrier();
  let inv = 1.0 / sqrt(red[0] / f32(p.d) + p.eps);
  var j = tid;
  for (; j + 3u * WG < p.d; j += 4u * WG) {
    let a = x[base + j];
    let b = x[base + j + WG];
    let c = x[base + j + 2u * WG];
    let e = x[base + j + 3u * WG];
    let wa = w[j];
    let wb = w[j + WG];
    let wc = w[j + 2u * WG];
    let we = w[j + 3u * WG];
    y[base + j] = a * inv * wa;
    y[base + j + WG] = b * inv * wb;
    y[base + j + 2u * WG] = c * inv * wc;
    y[base + j + 3u * WG] = e * inv * we;
  }
  for (; j < p.d; j += WG) {
    y[base + j] = x[base + j] * inv * w[j];
  }
}
