// Embedding lookup: y[t][i] = table[ids[t]][i]. The table is f32 (dtype 0),
// f16 (dtype 1, two per u32) or Q4_K (dtype 2, d % 256 == 0), read as u32
// words.

struct Params {
  n: u32,     // tokens
  d: u32,     // row length
  dtype: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> table: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

fn scale_min(sb: u32, j: u32) -> vec2<f32> {
  // scales bytes start at byte 4 of the block: word sb + 1.
  let a = (table[sb + 1u + j / 4u] >> ((j & 3u) * 8u)) & 0xffu;
  let b = (table[sb + 1u + (j + 4u) / 4u] >> (((j + 4u) & 3u) * 8u)) & 0xffu;
  if (j < 4u) {
    return vec2<f32>(f32(a & 63u), f32(b & 63u));
  }
  let c = (table[sb + 1u + (j - 4u) / 4u] >> (((j - 4u) & 3u) * 8u)) & 0xffu;
  return vec2<f32>(f32((b & 0xfu) | ((c >> 6u) << 4u)), f32((b >> 4u) | ((a >> 6u) << 4u)));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let g = (wid.x + wid.y * p.gx) * 256u + tid;
  if (g >= p.n * p.d) {
    return;
  }
  let t = g / p.d;
  let i = g % p.d;
  let e = ids[t] * p.d + i;
  var v = 0.0;
  if (p.dtype == 0u) {
    v = bitcast<f32>(table[e]);
  } else if (p.dtype == 1u) {
    v = unpack2x16float(table[e >> 1u])[e & 1u];
  } else {
    let blk = e / 256u;
    let l = e % 256u;
    let sb = blk * 36u;             // block start in u32 words
    let grp = l / 64u;              // quant byte group
    let hi = (l / 32u) & 1u;        // high nibble for the second 32
    let qb = grp * 32u + (l % 32u); // quant byte index
    let byte = (table[sb + 4u + qb / 4u] >> ((qb & 3u) * 8u)) & 0xffu;
    let qv = select(byte & 0xfu, byte >> 4u, hi == 1u);
    let dm = unpack2x16float(table[sb]);
    let smin = scale_min(sb, l / 32u);
    v = (dm.x * smin.x) * f32(qv) - dm.y * smin.y;
  }
  y[g] = v;
}
