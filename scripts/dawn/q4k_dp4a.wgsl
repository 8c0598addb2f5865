// Probe kernel (scripts/dawn, not the op library's): y = W x for W in
// GGML block_q4_K rows and x quantized to int8 in groups of 16 (xq: 16
// values packed 4 a word, in order; xs: the group's scale and the sum of
// its dequantized values), with dot4I8Packed for four weights at once
// and the row's partial sums met by subgroup shuffles instead of a
// workgroup-memory tree. Needs WGSL's packed_4x8_integer_dot_product and
// the subgroups feature (Dawn: both; wgpu-native v22: neither).
//
// The layout is q4k_matmul.wgsl's: 8 threads a block (thread c the quant
// bytes 16c..16c+15: weights 16(c%2)..+15 of sub-blocks 2(c/2) and
// 2(c/2)+1, low and high nibbles), SPR block slots a row group (8 SPR
// threads, within one subgroup), ROWS rows a thread, the next block's
// words loaded before this block's arithmetic. The harness replaces
// ROWS, SPR and WG before it compiles.
enable subgroups;

const ROWS: u32 = 4u;
const SPR: u32 = 2u;
const WG: u32 = 128u;

struct Params {
  rows: u32,
  nb: u32, // blocks a row
  gx: u32,
  _p: u32,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> xs: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// scales returns (sc0, sc1, m0, m1) of sub-blocks 2j and 2j+1 from a
// block's header h (d and dmin in h.x, the 12 scale bytes in h.yzw).
fn scales(h: vec4<u32>, j: u32) -> vec4<f32> {
  let lo = j < 2u;
  let i = 2u * j;
  let k = (i - 4u) & 7u;
  let s_sc = select(8u * k, 8u * i, lo);
  let s_m = select(8u * k + 4u, 8u * i, lo);
  let mask = select(15u, 63u, lo);
  let s_hi = select(8u * k + 2u, 0u, lo);
  let m_hi = select(0x30u, 0u, lo);
  let a_sc = select(h.w, h.y, lo);
  let a_m = select(h.w, h.z, lo);
  let sc0 = ((a_sc >> s_sc) & mask) | ((h.y >> s_hi) & m_hi);
  let sc1 = ((a_sc >> (s_sc + 8u)) & mask) | ((h.y >> (s_hi + 8u)) & m_hi);
  let m0 = ((a_m >> s_m) & mask) | ((h.z >> s_hi) & m_hi);
  let m1 = ((a_m >> (s_m + 8u)) & mask) | ((h.z >> (s_hi + 8u)) & m_hi);
  return vec4<f32>(vec4<u32>(sc0, sc1, m0, m1));
}

fn blk(row0: u32, r: u32, b: u32) -> u32 {
  return (min(row0 + r, p.rows - 1u) * p.nb + b) * 9u;
}

const M4: u32 = 0x0f0f0f0fu;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let wg = wid.x + wid.y * p.gx;
  let c = tid & 7u;
  let slot = (tid >> 3u) & (SPR - 1u);
  let grp = (tid >> 3u) / SPR;
  let row0 = (wg * ((WG / 8u) / SPR) + grp) * ROWS;
  let j = c >> 1u;
  let half = c & 1u;
  var acc: array<f32, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    acc[r] = 0.0;
  }
  var ph: array<vec4<u32>, ROWS>;
  var pq: array<vec4<u32>, ROWS>;
  for (var r = 0u; r < ROWS; r++) {
    let o = blk(row0, r, slot);
    ph[r] = w[o];
    pq[r] = w[o + 1u + c];
  }
  for (var b = slot; b < p.nb; b += SPR) {
    var hs = ph;
    var qs = pq;
    let bn = min(b + SPR, p.nb - 1u);
    for (var r = 0u; r < ROWS; r++) {
      let o = blk(row0, r, bn);
      ph[r] = w[o];
      pq[r] = w[o + 1u + c];
    }
    let gl = b * 16u + 4u * j + half; // x's group of the low nibbles
    let al = xq[gl];
    let ah = xq[gl + 2u];
    let sl = xs[gl];
    let sh = xs[gl + 2u];
    for (var r = 0u; r < ROWS; r++) {
      let q = qs[r];
      let h = hs[r];
      let il = dot4I8Packed(q.x & M4, al.x) + dot4I8Packed(q.y & M4, al.y) + dot4I8Packed(q.z & M4, al.z) + dot4I8Packed(q.w & M4, al.w);
      let qh = q >> vec4<u32>(4u);
      let ih = dot4I8Packed(qh.x & M4, ah.x) + dot4I8Packed(qh.y & M4, ah.y) + dot4I8Packed(qh.z & M4, ah.z) + dot4I8Packed(qh.w & M4, ah.w);
      let dm = unpack2x16float(h.x);
      let s = scales(h, j);
      acc[r] += dm.x * (s.x * sl.x * f32(il) + s.y * sh.x * f32(ih)) - dm.y * (s.z * sl.y + s.w * sh.y);
    }
  }
  // The row group's 8 SPR lanes, by shuffles (SPR <= 4: a group within a
  // subgroup of 32 or more, aligned).
  for (var r = 0u; r < ROWS; r++) {
    var v = acc[r];
    for (var m = 1u; m < 8u * SPR; m <<= 1u) {
      v += subgroupShuffleXor(v, m);
    }
    acc[r] = v;
  }
  if ((tid & (8u * SPR - 1u)) == 0u) {
    for (var r = 0u; r < ROWS; r++) {
      if (row0 + r < p.rows) {
        y[row0 + r] = acc[r];
      }
    }
  }
}
