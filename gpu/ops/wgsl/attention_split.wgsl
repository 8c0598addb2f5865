// Decode attention, split over positions (flash-decoding), pass 1 of 2:
// workgroup (c, j) takes chunk c of CH (the override constant, 16, 32 or
// 64) cached positions of KV head j for
// the G = n_heads / n_kv query heads that share it, MAXG at a time
// (workgroup z; K and V are read once for each group of them) and writes, per query head h, its chunk's softmax
// partials to part[h][c]: the chunk's max score m, its sum of exp(s - m),
// and the hd unnormalized outputs sum exp(s - m) v. attention_merge
// combines the chunks. q [n_heads][hd]; k and v [max_len][n_kv][hd];
// hd <= 256 and a multiple of 4; MAXG * hd <= 1024 or G * hd <= 1024 (workgroup
// memory: 14 KiB of the 16 KiB WebGPU guarantees).
//
// Scores: 8 threads per position, interleaved over the row's vec4s, for
// all G heads. Softmax of the chunk: 64 threads a head. Outputs: R =
// 256 / hd threads per dimension, each a share of the positions, summed in
// workgroup memory.

struct Params {
  n_heads: u32,
  n_kv: u32,
  hd: u32,
  kv_len: u32,
  scale: f32,
  n_chunks: u32,
  _p0: u32,
  _p1: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
// Positions per chunk: 16, 32 or 64, set by the rule (attnChunk).
override CH: u32 = 32u;
const MAXG: u32 = 8u;  // query heads per KV head
const LANES: u32 = 8u; // threads per position for the scores
const PP: u32 = WG / LANES;
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, 1024>;        // the G query heads (G * hd <= 1024)
var<workgroup> red: array<f32, 2048>;       // MAXG * WG partial sums
var<workgroup> sc: array<f32, 512>;         // MAXG * CH scores, then weights
var<workgroup> ml: array<f32, 16>;          // per head: max, sum

// q4 is vec4 i of query head g (from workgroup memory).
fn q4(g: u32, i: u32) -> vec4<f32> {
  let b = g * p.hd + 4u * i;
  return vec4<f32>(qs[b], qs[b + 1u], qs[b + 2u], qs[b + 3u]);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let c = wid.x;
  let j = wid.y;
  let hd = p.hd;
  // Query heads h0 .. h0 + g_n of the G = n_heads / n_kv that share cache
  // head j: at most MAXG per workgroup (workgroup z picks which ones).
  let big_g = p.n_heads / p.n_kv;
  let h0 = j * big_g + wid.z * MAXG;
  let g_n = min(MAXG, big_g - wid.z * MAXG);
  let stride = p.n_kv * hd;
  let t0 = c * CH;
  for (var i = tid; i < g_n * hd; i += WG) {
    qs[i] = q[h0 * hd + i];
  }
  workgroupBarrier();

  // Scores: LANES threads per position, lane i reading dimensions i, i +
  // LANES, ... so that the lanes of a position read consecutive floats;
  // PP positions a pass, CH / PP passes (one, half idle, for CH 16).
  let lane = tid % LANES;
  let pp = tid / LANES;
  for (var p0 = 0u; p0 < CH; p0 += PP) {
    let pos = p0 + pp;
    let inside = pos < CH;
    let t = select(p.kv_len, t0 + pos, inside); // past the cache: no score
    var dots: array<f32, MAXG>;
    for (var g = 0u; g < MAXG; g++) {
      dots[g] = 0.0;
    }
    if (t < p.kv_len) {
      // vec4 i of the row: lanes read consecutive vec4s, four in flight.
      let kb = (t * stride + j * hd) >> 2u;
      let n4 = hd >> 2u;
      var i = lane;
      for (; i + 3u * LANES < n4; i += 4u * LANES) {
        let k0 = k[kb + i];
        let k1 = k[kb + i + LANES];
        let k2 = k[kb + i + 2u * LANES];
        let k3 = k[kb + i + 3u * LANES];
        for (var g = 0u; g < g_n; g++) {
          dots[g] += dot(q4(g, i), k0) + dot(q4(g, i + LANES), k1) + dot(q4(g, i + 2u * LANES), k2) + dot(q4(g, i + 3u * LANES), k3);
        }
      }
      for (; i < n4; i += LANES) {
        let kv = k[kb + i];
        for (var g = 0u; g < g_n; g++) {
          dots[g] += dot(q4(g, i), kv);
        }
      }
    }
    for (var g = 0u; g < g_n; g++) {
      red[g * WG + tid] = dots[g];
    }
    workgroupBarrier();
    if (lane == 0u && inside) {
      for (var g = 0u; g < g_n; g++) {
        var s = NEG;
        if (t < p.kv_len) {
          s = 0.0;
          for (var i = 0u; i < LANES; i++) {
            s += red[g * WG + tid + i];
          }
          s *= p.scale;
        }
        sc[g * CH + pos] = s;
      }
    }
    workgroupBarrier();
  }

  // The chunk's softmax: CH threads a head, WG / CH heads a round.
  let pi = tid % CH;
  for (var g0 = 0u; g0 < g_n; g0 += WG / CH) {
    let g = g0 + tid / CH;
    let live = g < g_n;
    var x = NEG;
    if (live) {
      x = sc[g * CH + pi];
    }
    red[tid] = x;
    for (var st = CH / 2u; st > 0u; st >>= 1u) {
      workgroupBarrier();
      if (pi < st) {
        red[tid] = max(red[tid], red[tid + st]);
      }
    }
    workgroupBarrier();
    let m = red[tid - pi];
    workgroupBarrier();
    let e = select(0.0, exp(x - m), live && t0 + pi < p.kv_len);
    if (live) {
      sc[g * CH + pi] = e;
    }
    red[tid] = e;
    for (var st = CH / 2u; st > 0u; st >>= 1u) {
      workgroupBarrier();
      if (pi < st) {
        red[tid] += red[tid + st];
      }
    }
    workgroupBarrier();
    if (live && pi == 0u) {
      ml[2u * g] = m;
      ml[2u * g + 1u] = red[tid];
    }
    workgroupBarrier();
  }

  // Outputs: dimension d, positions r, r + R, r + 2R, ... of the chunk
  // (R = 256 / hd threads a dimension), eight loads in flight; the R
  // shares are summed in workgroup memory. (vec4 loads here were slower
  // on the H100: more registers, and a reduction per head.)
  let R = max(WG / hd, 1u);
  let d = tid % hd;
  let r = tid / hd;
  var acc: array<f32, MAXG>;
  for (var g = 0u; g < MAXG; g++) {
    acc[g] = 0.0;
  }
  if (r < R) {
    let n = min(CH, p.kv_len - t0);
    let vb = t0 * stride + j * hd + d;
    var i = r;
    for (; i + 7u * R < n; i += 8u * R) {
      var vs: array<f32, 8>;
      for (var u = 0u; u < 8u; u++) {
        vs[u] = v[vb + (i + u * R) * stride];
      }
      for (var g = 0u; g < g_n; g++) {
        var a = acc[g];
        for (var u = 0u; u < 8u; u++) {
          a += sc[g * CH + i + u * R] * vs[u];
        }
        acc[g] = a;
      }
    }
    for (; i < n; i += R) {
      let vv = v[vb + i * stride];
      for (var g = 0u; g < g_n; g++) {
        acc[g] += sc[g * CH + i] * vv;
      }
    }
  }
  workgroupBarrier(); // red is reused
  if (r < R) {
    for (var g = 0u; g < g_n; g++) {
      red[g * WG + tid] = acc[g];
    }
  }
  workgroupBarrier();
  if (r == 0u) {
    for (var g = 0u; g < g_n; g++) {
      var s = 0.0;
      for (var i = 0u; i < R; i++) {
        s += red[g * WG + i * hd + d];
      }
      let h = h0 + g;
      let o = (h * p.n_chunks + c) * (hd + 2u);
      part[o + 2u + d] = s;
      if (d == 0u) {
        part[o] = ml[2u * g];
        part[o + 1u] = ml[2u * g + 1u];
      }
    }
  }
}
