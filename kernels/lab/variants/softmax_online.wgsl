// Softmax of each row of d, one workgroup per row (the op's dispatch
// rule), for long rows (a vocabulary's logits): the built-in reads a row
// three times (max, sum, write) with one load in flight per invocation;
// this reads it twice (the max and the sum together, the sum rescaled
// when the max grows: "online" softmax) with four independent loads in
// flight per invocation, which is what a single workgroup's loop is bound
// by on a large GPU.

struct Params {
  n: u32,
  d: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const LOW: f32 = -3.0e38; // below every logit; exp(LOW - m) is 0
var<workgroup> rm: array<f32, WG>;
var<workgroup> rs: array<f32, WG>;

// at returns x[base + i], or LOW past the row's end.
fn at(base: u32, i: u32) -> f32 {
  if (i < p.d) {
    return x[base + i];
  }
  return LOW;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let row = wid.x + wid.y * p.gx;
  if (row >= p.n) {
    return;
  }
  let base = row * p.d;
  // Pass 1: this invocation's max and its sum of exp(x - max).
  var m = LOW;
  var s = 0.0;
  for (var i = tid; i < p.d; i += 4u * WG) {
    let a = at(base, i);
    let b = at(base, i + WG);
    let c = at(base, i + 2u * WG);
    let e = at(base, i + 3u * WG);
    let nm = max(m, max(max(a, b), max(c, e)));
    s = s * exp(m - nm) + exp(a - nm) + exp(b - nm) + exp(c - nm) + exp(e - nm);
    m = nm;
  }
  rm[tid] = m;
  rs[tid] = s;
  // The workgroup's (max, sum): two partials (m1, s1), (m2, s2) make
  // (M, s1 exp(m1 - M) + s2 exp(m2 - M)).
  for (var k = WG >> 1u; k > 0u; k >>= 1u) {
    workgroupBarrier();
    if (tid < k) {
      let m1 = rm[tid];
      let m2 = rm[tid + k];
      let mm = max(m1, m2);
      rs[tid] = rs[tid] * exp(m1 - mm) + rs[tid + k] * exp(m2 - mm);
      rm[tid] = mm;
    }
  }
  workgroupBarrier();
  let mx = rm[0];
  let inv = 1.0 / rs[0];
  // Pass 2: write, four values in flight.
  for (var i = tid; i < p.d; i += 4u * WG) {
    let a = at(base, i);
    let b = at(base, i + WG);
    let c = at(base, i + 2u * WG);
    let e = at(base, i + 3u * WG);
    y[base + i] = exp(a - mx) * inv;
    if (i + WG < p.d) {
      y[base + i + WG] = exp(b - mx) * inv;
    }
    if (i + 2u * WG < p.d) {
      y[base + i + 2u * WG] = exp(c - mx) * inv;
    }
    if (i + 3u * WG < p.d) {
      y[base + i + 3u * WG] = exp(e - mx) * inv;
    }
  }
}
