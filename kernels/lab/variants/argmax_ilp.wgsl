// Argmax of n values into out[0] (u32): the lowest index of the largest
// value; NaNs are skipped. One workgroup (the op's dispatch rule): the
// built-in with four loads in flight per invocation instead of one, for a
// GPU where one workgroup's loop is bound by memory latency.

struct Params {
  n: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
  var bv = bitcast<f32>(0xff800000u); // -inf
  var bi = 0xffffffffu;
  let n = p.n;
  // Four independent loads per step, compared in index order (so the
  // lowest index of a tie still wins within the invocation).
  var i = tid;
  for (; i + 3u * WG < n; i += 4u * WG) {
    let v0 = x[i];
    let v1 = x[i + WG];
    let v2 = x[i + 2u * WG];
    let v3 = x[i + 3u * WG];
    if (v0 > bv) {
      bv = v0;
      bi = i;
    }
    if (v1 > bv) {
      bv = v1;
      bi = i + WG;
    }
    if (v2 > bv) {
      bv = v2;
      bi = i + 2u * WG;
    }
    if (v3 > bv) {
      bv = v3;
      bi = i + 3u * WG;
    }
  }
  for (; i < n; i += WG) {
    let v = x[i];
    if (v > bv) {
      bv = v;
      bi = i;
    }
  }
  rv[tid] = bv;
  ri[tid] = bi;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      let ov = rv[tid + s];
      let oi = ri[tid + s];
      if (oi != 0xffffffffu && (ri[tid] == 0xffffffffu || ov > rv[tid] || (ov == rv[tid] && oi < ri[tid]))) {
        rv[tid] = ov;
        ri[tid] = oi;
      }
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    out[0] = select(ri[0], 0u, ri[0] == 0xffffffffu);
  }
}
