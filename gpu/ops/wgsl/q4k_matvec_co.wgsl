// Fused Q4_K matrix-vector product with coalesced x: y[r] = sum_k W[r][k] x[k].
//
// Eight threads share a block, as in q4k_matmul, but thread c reads the
// quant words c, 8+c, 16+c, 24+c (word 8g+c holds, in its four bytes, the
// weights 64g+4c..64g+4c+3 in the low nibbles and 64g+32+4c.. in the high
// ones). The x values a thread needs are then the vec4s 8i+c of the block
// (sub-block i = 0..7), so the eight threads of a block read x in whole
// 128-byte lines, and each thread meets all eight sub-blocks. SPR block
// slots per row group, ROWS rows per thread (x read once for all of them),
// a tree over the row group's threads at the end.

struct Params {
  rows: u32,     // output rows
  nb: u32,       // blocks per row (cols / 256)
  spr: u32,      // block slots per row group (power of two, <= 32)
  n: u32,        // tokens (1)
  gx: u32,       // workgroups along x
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

override ROWS: u32 = 4u;
const WG: u32 = 256u;
const RED: u32 = WG * ROWS;
var<workgroup> red: array<f32, RED>;

const MAGIC: vec4<u32> = vec4<u32>(0x4b000000u);
const TWO23: vec4<f32> = vec4<f32>(8388608.0);

// bytes4 returns the low nibble (mask 0xf) or low 6 bits (mask 0x3f) of
// each byte of v as floats scaled by their byte position: (b0, 256 b1,
// 65536 b2, 65536 b3) with f32(2^23 + v) - 2^23, exact and conversion-free.
// The values they multiply carry the inverse scale (XS).
fn bytes4(v: u32, m: u32) -> vec4<f32> {
  let u = vec4<u32>(v, v, v, v >> 8u) & vec4<u32>(m, m << 8u, m << 16u, m << 16u);
  return bitcast<vec4<f32>>(u | MAGIC) - TWO23;
}

const XS: vec4<f32> = vec4<f32>(1.0, 0.00390625, 0.0000152587890625, 0.0000152587890625);

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let wg = wid.x + wid.y * p.gx;
  let c = tid & 7u;
  let slot = (tid >> 3u) & (p.spr - 1u);
  let grp = (tid >> 3u) / p.spr;
  let row0 = (wg * (32u / p.spr) + grp) * ROWS;

  var acc: array<f32, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    acc[r] = 0.0;
  }
  for (var b = slot; b < p.nb; b += p.spr) {
    // x of sub-block i for this thread: vec4 8i + c of the block, scaled by
    // XS for the byte positions, and its plain sum for the min term.
    var xv: array<vec4<f32>, 8>;
    var xsum: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
      let v = x[b * 64u + 8u * i + c];
      xsum[i] = v.x + v.y + v.z + v.w;
      xv[i] = v * XS;
    }
    // The scales multiply sums over sub-blocks, so they get the same
    // positional trick: scale i sits in byte i%4 of its word.
    let sa = vec4<f32>(xsum[0], xsum[1], xsum[2], xsum[3]) * XS;
    let sb = vec4<f32>(xsum[4], xsum[5], xsum[6], xsum[7]) * XS;
    for (var r = 0u; r < ROWS; r++) {
      let row = min(row0 + r, p.rows - 1u);
      let base = (row * p.nb + b) * 36u;
      let dm = unpack2x16float(w[base]);
      let hy = w[base + 1u];
      let hz = w[base + 2u];
      let hw = w[base + 3u];
      // dot of each sub-block's nibbles with its x
      var dv: array<f32, 8>;
      for (var g = 0u; g < 4u; g++) {
        let q = w[base + 4u + 8u * g + c];
        dv[2u * g] = dot(bytes4(q, 0xfu), xv[2u * g]);
        dv[2u * g + 1u] = dot(bytes4(q >> 4u, 0xfu), xv[2u * g + 1u]);
      }
      // get_scale_min_k4 for all eight sub-blocks, four at a time:
      // scales 0-3 = Y & 63, mins 0-3 = Z & 63,
      // scales 4-7 = W & 15 | (Y >> 6) << 4, mins 4-7 = W >> 4 | (Z >> 6) << 4.
      let sc_a = bytes4(hy, 0x3fu);
      let m_a = bytes4(hz, 0x3fu);
      let sc_b = bytes4((hw & 0x0f0f0f0fu) | ((hy >> 2u) & 0x30303030u), 0x3fu);
      let m_b = bytes4(((hw >> 4u) & 0x0f0f0f0fu) | ((hz >> 2u) & 0x30303030u), 0x3fu);
      let d_a = vec4<f32>(dv[0], dv[1], dv[2], dv[3]) * XS;
      let d_b = vec4<f32>(dv[4], dv[5], dv[6], dv[7]) * XS;
      acc[r] += dm.x * (dot(sc_a, d_a) + dot(sc_b, d_b)) - dm.y * (dot(m_a, sa) + dot(m_b, sb));
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
      let row = row0 + r;
      if (row < p.rows) {
        y[row] = red[r * WG + tid];
      }
    }
  }
}
