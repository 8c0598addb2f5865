// Argmax in two dispatches of this kernel. Stage 0: workgroup w takes the
// block [w * block, (w + 1) * block) of the n f32 values in x and writes
// its best (value bits, index) pair to out[2w], out[2w + 1]. Stage 1: one
// workgroup reduces n such pairs (x) to out[0], the index. The lowest
// index of the largest value wins; NaNs are skipped; a block of NaNs
// yields index 0xffffffff, which loses to any number. Stage 2 is both at
// once in one workgroup (n values to the index; for n <= block).

struct Params {
  n: u32,
  block: u32,
  stage: u32,
  _p: u32,
}

@group(0) @binding(0) var<storage, read> x: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;

// better reports whether (v, i) beats (bv, bi).
fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return i != NONE && v == v && (bi == NONE || v > bv || (v == bv && i < bi));
}

fn at(j: u32) -> vec2<u32> {
  if (p.stage == 1u) {
    return vec2<u32>(x[2u * j], x[2u * j + 1u]);
  }
  return vec2<u32>(x[j], j);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let lo = wid.x * p.block;
  let hi = min(p.n, lo + p.block);
  var bv = 0.0;
  var bi = NONE;
  var j = lo + tid;
  // Four loads in flight.
  for (; j + 3u * WG < hi; j += 4u * WG) {
    let a = at(j);
    let b = at(j + WG);
    let c = at(j + 2u * WG);
    let d = at(j + 3u * WG);
    if (better(bitcast<f32>(a.x), a.y, bv, bi)) { bv = bitcast<f32>(a.x); bi = a.y; }
    if (better(bitcast<f32>(b.x), b.y, bv, bi)) { bv = bitcast<f32>(b.x); bi = b.y; }
    if (better(bitcast<f32>(c.x), c.y, bv, bi)) { bv = bitcast<f32>(c.x); bi = c.y; }
    if (better(bitcast<f32>(d.x), d.y, bv, bi)) { bv = bitcast<f32>(d.x); bi = d.y; }
  }
  for (; j < hi; j += WG) {
    let a = at(j);
    if (better(bitcast<f32>(a.x), a.y, bv, bi)) { bv = bitcast<f32>(a.x); bi = a.y; }
  }
  rv[tid] = bv;
  ri[tid] = bi;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s && better(rv[tid + s], ri[tid + s], rv[tid], ri[tid])) {
      rv[tid] = rv[tid + s];
      ri[tid] = ri[tid + s];
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    if (p.stage == 0u) {
      out[2u * wid.x] = bitcast<u32>(rv[0]);
      out[2u * wid.x + 1u] = ri[0];
    } else {
      out[0] = select(ri[0], 0u, ri[0] == NONE);
    }
  }
}
