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
// KEEP values a thread keeps in registers: a row of at most KEEP * WG
// (4096, a decode step's hidden size) is read once, x and w together.
const KEEP: u32 = 16u;
// The sum meets in two levels: GS threads' partials, then the groups'.
const GS: u32 = 16u;
const NG: u32 = WG / GS;
var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, NG>;

// total returns the sum of v over the workgroup (two barriers, not a
// tree of eight: a row of a decode step is one workgroup's whole work,
// so its time is its chain of loads and barriers).
fn total(tid: u32, v: f32) -> f32 {
  red[tid] = v;
  workgroupBarrier();
  if (tid < NG) {
    var t = 0.0;
    for (var i = 0u; i < GS; i++) {
      t += red[tid * GS + i];
    }
    red2[tid] = t;
  }
  workgroupBarrier();
  var s = 0.0;
  for (var i = 0u; i < NG; i++) {
    s += red2[i];
  }
  return s;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let row = wid.x + wid.y * p.gx;
  if (row >= p.n) {
    return;
  }
  let base = row * p.d;
  if (p.d <= KEEP * WG) {
    // Every load of the row, x and w, before any is used; the output
    // from the registers.
    var xs: array<f32, KEEP>;
    var ws: array<f32, KEEP>;
    for (var k = 0u; k < KEEP; k++) {
      let i = tid + k * WG;
      let j = select(0u, i, i < p.d);
      xs[k] = select(0.0, x[base + j], i < p.d);
      ws[k] = w[j];
    }
    var s = 0.0;
    for (var k = 0u; k < KEEP; k++) {
      s += xs[k] * xs[k];
    }
    let inv = 1.0 / sqrt(total(tid, s) / f32(p.d) + p.eps);
    for (var k = 0u; k < KEEP; k++) {
      let i = tid + k * WG;
      if (i < p.d) {
        y[base + i] = xs[k] * inv * ws[k];
      }
    }
    return;
  }
  // Longer rows: four loads in flight per thread, then a second pass.
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
  let inv = 1.0 / sqrt(total(tid, (s0 + s1) + (s2 + s3)) / f32(p.d) + p.eps);
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
