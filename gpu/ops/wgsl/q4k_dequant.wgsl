// Q4_K -> f32 (OUT_F16 = 0) or f16 (OUT_F16 = 1, two halves per u32,
// lower index in the low half). Each weight is d*sc*q - dmin*m, computed
// in f32 as GGML's dequantize_row_q4_K does (d*sc and dmin*m rounded first).
//
// Eight threads per block. Thread c reads the quant words 8g+c (g = 0..3):
// word 8g+c holds weights 64g+4c..+3 (low nibbles, sub-block 2g) and
// 64g+32+4c..+3 (high nibbles, sub-block 2g+1). So thread c writes the
// four weights 32i+4c.. of every sub-block i, and the eight threads of a
// block write each sub-block's 32 outputs as one contiguous run.

struct Params {
  blocks: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read_write> y: array<vec2<u32>>; // 8 bytes: 2 f32 or 4 f16
@group(1) @binding(0) var<uniform> p: Params;

override OUT_F16: u32 = 0u;

// f32(2^23 + v) - 2^23 == v exactly, without int-to-float conversions.
fn tofloat(v: vec4<u32>) -> vec4<f32> {
  return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

fn bytes(v: u32, m: u32) -> vec4<u32> {
  return vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(m);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let g = (wid.x + wid.y * p.gx) * 256u + tid;
  let blk = g >> 3u;
  if (blk >= p.blocks) {
    return;
  }
  let c = g & 7u;
  let base = blk * 36u;
  let dm = unpack2x16float(w[base]);
  let hy = w[base + 1u];
  let hz = w[base + 2u];
  let hw = w[base + 3u];
  // get_scale_min_k4 for all eight sub-blocks, four at a time.
  let sc_a = tofloat(bytes(hy, 0x3fu));
  let m_a = tofloat(bytes(hz, 0x3fu));
  let sc_b = tofloat(bytes((hw & 0x0f0f0f0fu) | ((hy >> 2u) & 0x30303030u), 0x3fu));
  let m_b = tofloat(bytes(((hw >> 4u) & 0x0f0f0f0fu) | ((hz >> 2u) & 0x30303030u), 0x3fu));
  let d_a = dm.x * sc_a;
  let d_b = dm.x * sc_b;
  let n_a = dm.y * m_a;
  let n_b = dm.y * m_b;
  for (var grp = 0u; grp < 4u; grp++) {
    let q = w[base + 4u + 8u * grp + c];
    let lo = tofloat(bytes(q, 0xfu));
    let hi = tofloat(bytes(q >> 4u, 0xfu));
    let i0 = 2u * grp;
    let i1 = i0 + 1u;
    let d0 = select(d_b[i0 & 3u], d_a[i0 & 3u], i0 < 4u);
    let m0 = select(n_b[i0 & 3u], n_a[i0 & 3u], i0 < 4u);
    let d1 = select(d_b[i1 & 3u], d_a[i1 & 3u], i1 < 4u);
    let m1 = select(n_b[i1 & 3u], n_a[i1 & 3u], i1 < 4u);
    let v0 = d0 * lo - vec4<f32>(m0);
    let v1 = d1 * hi - vec4<f32>(m1);
    let o0 = blk * 64u + 8u * i0 + c; // index of the 4 weights 32*i0 + 4c.. (in units of 4)
    let o1 = blk * 64u + 8u * i1 + c;
    if (OUT_F16 == 0u) {
      y[2u * o0] = bitcast<vec2<u32>>(v0.xy);
      y[2u * o0 + 1u] = bitcast<vec2<u32>>(v0.zw);
      y[2u * o1] = bitcast<vec2<u32>>(v1.xy);
      y[2u * o1 + 1u] = bitcast<vec2<u32>>(v1.zw);
    } else {
      y[o0] = vec2<u32>(pack2x16float(v0.xy), pack2x16float(v0.zw));
      y[o1] = vec2<u32>(pack2x16float(v1.xy), pack2x16float(v1.zw));
    }
  }
}
