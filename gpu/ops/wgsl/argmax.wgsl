// Argmax of n values into out[0] (u32): the lowest index of the largest
// value; NaNs are skipped. One workgroup.

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
  for (var i = tid; i < p.n; i += WG) {
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
