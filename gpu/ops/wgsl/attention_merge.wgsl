// Decode attention, pass 2 of 2 (see attention_split): workgroup h merges
// query head h's chunk partials, out[h][d] = sum_c exp(m_c - M) acc_c[d] /
// sum_c exp(m_c - M) l_c with M the largest chunk max. The chunks are
// spread over the threads (their maxima and weights), then R = 256 / hd
// threads per dimension sum shares of the chunks, four loads in flight
// each: a merge of a few dozen chunks is bound by load latency, not
// bandwidth. hd <= 256.

struct Params {
  n_heads: u32,
  hd: u32,
  n_chunks: u32,
  _p0: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const BLK: u32 = 1024u; // chunk weights kept at a time
const NEG: f32 = -3.0e38;

var<workgroup> ws: array<f32, BLK>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let h = wid.x;
  let hd = p.hd;
  let nc = p.n_chunks;
  let row = hd + 2u;
  let base = h * nc * row;

  var m = NEG;
  for (var c = tid; c < nc; c += WG) {
    m = max(m, part[base + c * row]);
  }
  red[tid] = m;
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (tid < st) {
      red[tid] = max(red[tid], red[tid + st]);
    }
  }
  workgroupBarrier();
  let mx = red[0];

  let R = max(WG / hd, 1u);
  let d = tid % hd;
  let r = tid / hd;
  var l = 0.0;
  var acc = 0.0;
  for (var c0 = 0u; c0 < nc; c0 += BLK) {
    let n = min(BLK, nc - c0);
    workgroupBarrier();
    for (var c = tid; c < n; c += WG) {
      let at = base + (c0 + c) * row;
      let w = exp(part[at] - mx);
      ws[c] = w;
      l += w * part[at + 1u];
    }
    workgroupBarrier();
    if (r < R) {
      let o0 = base + c0 * row + 2u + d;
      var i = r;
      var a0 = 0.0;
      var a1 = 0.0;
      var a2 = 0.0;
      var a3 = 0.0;
      for (; i + 3u * R < n; i += 4u * R) {
        let v0 = part[o0 + i * row];
        let v1 = part[o0 + (i + R) * row];
        let v2 = part[o0 + (i + 2u * R) * row];
        let v3 = part[o0 + (i + 3u * R) * row];
        a0 += ws[i] * v0;
        a1 += ws[i + R] * v1;
        a2 += ws[i + 2u * R] * v2;
        a3 += ws[i + 3u * R] * v3;
      }
      for (; i < n; i += R) {
        a0 += ws[i] * part[o0 + i * row];
      }
      acc += (a0 + a1) + (a2 + a3);
    }
  }
  // The sum of the weighted l over all threads, then the R shares of each
  // dimension.
  workgroupBarrier();
  red[tid] = l;
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (tid < st) {
      red[tid] += red[tid + st];
    }
  }
  workgroupBarrier();
  let total = red[0];
  workgroupBarrier();
  red[tid] = acc;
  workgroupBarrier();
  if (r == 0u) {
    var s = 0.0;
    for (var i = 0u; i < R; i++) {
      s += red[i * hd + d];
    }
    o[h * hd + d] = s / total;
  }
}
