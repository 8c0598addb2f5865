// BENCHMARK PROBE, not a kernel: the memory accesses of the Q4_K
// matrix-vector kernels with trivial arithmetic, to tell memory behaviour
// from arithmetic. Same thread layout as q4k_matmul (8 threads per block,
// SPR slots per row group, ROWS rows per thread, tree reduction).
//   MODE 0: quant and header loads as vec4 (q4k_matmul), no x
//   MODE 1: as 0, plus x as q4k_matmul reads it (64-byte runs per thread)
//   MODE 2: as 0, plus x in whole lines (vec4 8i+c, q4k_matvec_co)
//   MODE 3: q4k_matvec_co's loads: header and quant words as u32, x lines
//   MODE 4: as 1, but x indices wrap in 1 KiB (x always hits the L1)

struct Params {
  rows: u32,
  nb: u32,
  spr: u32,
  n: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> w4: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> w1: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

override ROWS: u32 = 4u;
override MODE: u32 = 0u;
const WG: u32 = 256u;
const RED: u32 = WG * ROWS;
var<workgroup> red: array<f32, RED>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let wg = wid.x + wid.y * p.gx;
  let c = tid & 7u;
  let slot = (tid >> 3u) & (p.spr - 1u);
  let grp = (tid >> 3u) / p.spr;
  let row0 = (wg * (32u / p.spr) + grp) * ROWS;
  let j = c >> 1u;
  let half = c & 1u;
  var acc: array<f32, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    acc[r] = 0.0;
  }
  for (var b = slot; b < p.nb; b += p.spr) {
    var xv = vec4<f32>(1.0);
    if (MODE == 1u || MODE == 4u) {
      var xb = b * 64u + j * 16u + half * 4u;
      if (MODE == 4u) {
        xb = xb & 63u;
      }
      xv = x[xb] + x[xb + 1u] + x[xb + 2u] + x[xb + 3u] + x[xb + 8u] + x[xb + 9u] + x[xb + 10u] + x[xb + 11u];
    } else if (MODE == 2u || MODE == 3u) {
      for (var i = 0u; i < 8u; i++) {
        xv += x[b * 64u + 8u * i + c];
      }
    }
    for (var r = 0u; r < ROWS; r++) {
      let row = min(row0 + r, p.rows - 1u);
      var v: vec4<u32>;
      if (MODE == 3u) {
        let base = (row * p.nb + b) * 36u;
        v = vec4<u32>(w1[base], w1[base + 1u], w1[base + 2u], w1[base + 3u]);
        v ^= vec4<u32>(w1[base + 4u + c], w1[base + 12u + c], w1[base + 20u + c], w1[base + 28u + c]);
      } else {
        let blk = (row * p.nb + b) * 9u;
        v = w4[blk] ^ w4[blk + 1u + c];
      }
      acc[r] += dot(bitcast<vec4<f32>>(v & vec4<u32>(0x3f7fffffu)), xv);
    }
  }
  let seg = 8u * p.spr;
  for (var r = 0u; r < ROWS; r++) {
    red[r * WG + tid] = acc[r];
  }
  for (var s = seg >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if ((tid & (seg - 1u)) < s) {
      for (var r = 0u; r < ROWS; r++) {
        red[r * WG + tid] += red[r * WG + tid + s];
      }
    }
  }
  if ((tid & (seg - 1u)) == 0u) {
    for (var r = 0u; r < ROWS; r++) {
      if (row0 + r < p.rows) {
        y[row0 + r] = red[r * WG + tid];
      }
    }
  }
}
