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
// The ROPE flavor (kernel attention_split_rope; lines marked //+ROPE)
// is a decode step's RoPE and cache store in the same dispatch, for
// chunks of 32 (CH) and hd of 64 or 128, NeoX pairs over the whole head:
// q is the stacked q k v product's output (q heads, then k_off and v_off
// floats in, the new position's k and v rows), unrotated; each workgroup
// rotates its query heads as it loads them, takes the new position
// (kv_len - 1) from q's k and v rows instead of the caches (k rotated),
// and the workgroup of its chunk with z 0 writes those rows into the
// caches for the steps after. The arithmetic is rope.wgsl's: the same
// bits as rope_kv and then attention_split.
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
//+ROPE  k_off: u32, // where the new k row starts in q (floats)
//+ROPE  v_off: u32, // and the new v row
//+ROPE  _p2: u32,
//+ROPE  _p3: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
//-ROPE @group(0) @binding(1) var<storage, read> k: array<vec4<f32>>;
//-ROPE @group(0) @binding(2) var<storage, read> v: array<vec4<f32>>;
//+ROPE @group(0) @binding(1) var<storage, read_write> k: array<vec4<f32>>;
//+ROPE @group(0) @binding(2) var<storage, read_write> v: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;
//+ROPE @group(0) @binding(4) var<storage, read> freqs: array<f32>;

//-ROPE const ROPE: bool = false;
//+ROPE const ROPE: bool = true;

// q4at is vec4 i (a float index, a multiple of 4) of q.
fn q4at(i: u32) -> vec4<f32> {
  return vec4<f32>(q[i], q[i + 1u], q[i + 2u], q[i + 3u]);
}

// rot4 is a's four elements turned as rope.wgsl turns them at the new
// position (kv_len - 1), b its partners, e0 the first one's pair index:
// a * c - b * s where a is in the first half (first), else b * s + a *
// c (rope.wgsl's pair (b, a)).
//-ROPE fn rot4(a: vec4<f32>, b: vec4<f32>, e0: u32, first: bool) -> vec4<f32> { return a; }
//+ROPE fn rot4(a: vec4<f32>, b: vec4<f32>, e0: u32, first: bool) -> vec4<f32> {
//+ROPE   var o = a;
//+ROPE   for (var u = 0u; u < 4u; u++) {
//+ROPE     let ang = f32(p.kv_len - 1u) * freqs[e0 + u];
//+ROPE     let kk = round(ang * INV_TWO_PI);
//+ROPE     let r = (ang - kk * TWO_PI_HI) - kk * TWO_PI_LO;
//+ROPE     let c = cos(r);
//+ROPE     let s = sin(r);
//+ROPE     if (first) {
//+ROPE       o[u] = a[u] * c - b[u] * s;
//+ROPE     } else {
//+ROPE       o[u] = b[u] * s + a[u] * c;
//+ROPE     }
//+ROPE   }
//+ROPE   return o;
//+ROPE }

// 2*pi split as in rope.wgsl.
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.0019353071795864769;
const INV_TWO_PI: f32 = 0.15915494309189535;

// qpair is where the rotation partners of q's vec4 at float b start.
fn qpair(b: u32, hd: u32) -> u32 {
  let half = hd / 2u;
  return select(b - half, b + half, b % hd < half);
}

// qturn is q's vec4 a at float b, pa its partners (qpair), rotated with
// ROPE.
fn qturn(a: vec4<f32>, pa: vec4<f32>, b: u32, hd: u32) -> vec4<f32> {
  if (!ROPE) {
    return a;
  }
  let half = hd / 2u;
  let e = b % hd; // element of the head
  return rot4(a, pa, e % half, e < half);
}

// vrow is vec4 vb of the v cache's row t (stride4 vec4s a row); with
// ROPE the new position's comes from q's v row (vb's head j, vec4 dv),
// and workgroup z 0 stores it.
fn vrow(t: u32, stride4: u32, vb: u32, z: u32) -> vec4<f32> {
  if (ROPE && t == p.kv_len - 1u) {
//+ROPE    let x = q4at(p.v_off + 4u * vb);
//+ROPE    if (z == 0u) {
//+ROPE      v[t * stride4 + vb] = x;
//+ROPE    }
//+ROPE    return x;
  }
  return v[t * stride4 + vb];
}

const WG: u32 = 256u;
// Positions per chunk: 16, 32 or 64, set by the rule (attnChunk).
override CH: u32 = 32u;
// 1: CH is 32 and p.hd 32, 64 or 128 (main_v's shapes); 0: any other.
override V: u32 = 0u;
// The head dimension where the rule sets it (with V 1), so that the
// compiler folds what depends on it; 0: p.hd's, at run time. (The RoPE
// flavor holds 65 registers a thread with it at run time and 64 with it
// 128, on an H200: 3 workgroups an SM or 4.)
override HD: u32 = 0u;

// headDim is the head dimension: HD, or p.hd where HD is 0.
fn headDim() -> u32 {
  return select(p.hd, HD, HD != 0u);
}
// The cache heads (NKV) and the query heads a cache head serves (GQ, at
// most MAXG: one workgroup z) where the rule sets them, so that the loops
// over a workgroup's heads and the caches' strides fold; 0: the params'.
override NKV: u32 = 0u;
override GQ: u32 = 0u;

// kvHeads is the number of cache heads: NKV, or p.n_kv.
fn kvHeads() -> u32 {
  return select(p.n_kv, NKV, NKV != 0u);
}

// Heads are workgroup z's query heads of cache head j: the first and how
// many (at most MAXG).
struct Heads {
  h0: u32,
  n: u32,
}

fn headsOf(j: u32, z: u32) -> Heads {
  if (GQ != 0u) {
    return Heads(j * GQ, GQ);
  }
  let big_g = p.n_heads / p.n_kv;
  return Heads(j * big_g + z * MAXG, min(MAXG, big_g - z * MAXG));
}
const MAXG: u32 = 8u;  // query heads per KV head
const LANES: u32 = 8u; // threads per position for the scores
const PP: u32 = WG / LANES;
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<vec4<f32>, 256>;   // the G query heads (G * hd <= 1024)
// MAXG * WG partial sums; main_v's outputs as four planes of 264 floats
// for each of two heads (2 * 1056: see there).
var<workgroup> red: array<f32, 2112>;
var<workgroup> sc: array<f32, 512>;         // MAXG * CH scores, then weights
var<workgroup> ml: array<f32, 16>;          // per head: max, sum

// q4 is vec4 i of query head g (from workgroup memory).
fn q4(g: u32, i: u32) -> vec4<f32> {
  return qs[g * (headDim() >> 2u) + i];
}

// vat is element i of v.
fn vat(i: u32) -> f32 {
  return v[i >> 2u][i & 3u];
}

// writePartial writes dimension d's sum s of query head h (the
// workgroup's head g) to chunk c's partials, and with d 0 the chunk's max
// and sum for that head from ml.
fn writePartial(h: u32, c: u32, g: u32, d: u32, s: f32) {
  let o = (h * p.n_chunks + c) * (headDim() + 2u);
  part[o + 2u + d] = s;
  if (d == 0u) {
    part[o] = ml[2u * g];
    part[o + 1u] = ml[2u * g + 1u];
  }
}

// chunkSoftmax turns the chunk's scores in sc (heads 0 .. g_n - 1, CH
// each) into exp(s - m) and keeps each head's max m and sum in ml: CH
// threads a head, WG / CH heads a round.
fn chunkSoftmax(tid: u32, g_n: u32, t0: u32) {
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
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  // Chunks of 32 and hd of 32, 64 or 128: every load at once (main_v).
  // V, set by the dispatch rule, says so as a constant: the path not
  // taken is then compiled out, and its registers do not count against
  // the one taken.
  if (ROPE || V == 1u) {
    main_v(wid, tid);
    return;
  }
  let c = wid.x;
  let j = wid.y;
  let hd = headDim();
  // Query heads h0 .. h0 + g_n of the G = n_heads / n_kv that share cache
  // head j: at most MAXG per workgroup (workgroup z picks which ones).
  let hs = headsOf(j, wid.z);
  let h0 = hs.h0;
  let g_n = hs.n;
  let stride = kvHeads() * hd;
  let t0 = c * CH;
  for (var i = tid; i < g_n * (hd >> 2u); i += WG) {
    let b = h0 * hd + 4u * i;
    qs[i] = vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]);
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

  chunkSoftmax(tid, g_n, t0);

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
        vs[u] = vat(vb + (i + u * R) * stride);
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
      let vv = vat(vb + i * stride);
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
      writePartial(h0 + g, c, g, d, s);
    }
  }
}

// main_v is main for chunks of 32 positions (CH 32) and hd of 32, 64 or
// 128, with every load of the chunk in flight at once: main loads the
// chunk's K, reduces the scores and their softmax, and only then loads V,
// two trips to memory one after the other. Here each thread loads its
// share of K (up to four vec4s of a row: 8 threads a position) and of V
// (up to four vec4s: hd / 4 threads a row, 256 / (hd / 4) rows at a time)
// into registers before the first reduction, so that V arrives while the
// scores are reduced (H100, 32 heads over 8 of 128 at 4096 positions:
// 24.4 us against 29.2 with the merge). Scores: thread (head, position)
// sums its position's eight lanes. Outputs: thread (vec4 dv of the row,
// rows group r) sums its rows weighted, for each query head; the groups'
// sums are added in workgroup memory, two heads a round.

const CV: u32 = 32u; // positions a chunk in main_v

fn main_v(wid: vec3<u32>, tid: u32) {
  let c = wid.x;
  let j = wid.y;
  let hd = headDim();
  let n4 = hd >> 2u; // 8, 16 or 32
  let hs = headsOf(j, wid.z);
  let h0 = hs.h0;
  let g_n = hs.n;
  let zero = vec4<f32>(0.0);

  // The query heads' vec4 of this thread (g_n * n4 <= 256), loaded first
  // so that they arrive before K and V; rotated and stored once those are
  // asked for.
  let qn = g_n * n4;
  let qb = h0 * hd + 4u * tid;
  var qa = zero;
  var qp = zero;
  if (tid < qn) {
    qa = q4at(qb);
    if (ROPE) {
      qp = q4at(qpair(qb, hd));
    }
  }
  let kv = loadKV(c, j, wid.z, tid);
  if (tid < qn) {
    qs[tid] = qturn(qa, qp, qb, hd);
  }
  workgroupBarrier();
  chunkOut(c, h0, g_n, tid, kv);
}

// KV is a thread's share of a chunk's K and V in main_v's layout.
struct KV {
  k0: vec4<f32>,
  k1: vec4<f32>,
  k2: vec4<f32>,
  k3: vec4<f32>,
  v0: vec4<f32>,
  v1: vec4<f32>,
  v2: vec4<f32>,
  v3: vec4<f32>,
}

// loadKV asks for chunk c's K and V of cache head j, the thread's share;
// with ROPE the new position's rows come from q, and workgroup z 0
// stores them into the caches.
fn loadKV(c: u32, j: u32, z: u32, tid: u32) -> KV {
  let hd = headDim();
  let n4 = hd >> 2u;
  let stride4 = (kvHeads() * hd) >> 2u;
  let t0 = c * CV;
  var o: KV; // zeros
  // K: position pos = tid / 8, vec4s lane, lane + 8, ... of its row (fewer
  // than four when hd < 128).
  let lane = tid % LANES;
  let pos = tid / LANES;
  let t = t0 + pos;
  let kin = t < p.kv_len;
  let kb = t * stride4 + j * n4;
  if (ROPE && t == p.kv_len - 1u) {
    // The new position: q's k row, rotated (hd 64: vec4s lane and lane
    // + 8 are a pair; 128: lane and lane + 16, lane + 8 and lane + 24),
    // and stored by workgroup z 0.
//+ROPE    let kr = p.k_off + 4u * j * n4;
//+ROPE    let a0 = q4at(kr + 4u * lane);
//+ROPE    let a1 = q4at(kr + 4u * (lane + LANES));
//+ROPE    if (n4 == 16u) {
//+ROPE      o.k0 = rot4(a0, a1, 4u * lane, true);
//+ROPE      o.k1 = rot4(a1, a0, 4u * lane, false);
//+ROPE    } else {
//+ROPE      let a2 = q4at(kr + 4u * (lane + 2u * LANES));
//+ROPE      let a3 = q4at(kr + 4u * (lane + 3u * LANES));
//+ROPE      o.k0 = rot4(a0, a2, 4u * lane, true);
//+ROPE      o.k1 = rot4(a1, a3, 4u * (lane + LANES), true);
//+ROPE      o.k2 = rot4(a2, a0, 4u * lane, false);
//+ROPE      o.k3 = rot4(a3, a1, 4u * (lane + LANES), false);
//+ROPE    }
//+ROPE    if (z == 0u) {
//+ROPE      k[kb + lane] = o.k0;
//+ROPE      k[kb + lane + LANES] = o.k1;
//+ROPE      if (n4 == 32u) {
//+ROPE        k[kb + lane + 2u * LANES] = o.k2;
//+ROPE        k[kb + lane + 3u * LANES] = o.k3;
//+ROPE      }
//+ROPE    }
  } else if (kin) {
    o.k0 = k[kb + lane];
    if (lane + LANES < n4) { o.k1 = k[kb + lane + LANES]; }
    if (lane + 2u * LANES < n4) { o.k2 = k[kb + lane + 2u * LANES]; }
    if (lane + 3u * LANES < n4) { o.k3 = k[kb + lane + 3u * LANES]; }
  }
  // V: vec4 dv of rows r, r + R, r + 2R, r + 3R of the chunk (R = 256 /
  // n4 rows at a time: 8, 16 or 32; rows past 32 are not read).
  let dv = tid % n4;
  let r = tid / n4;
  let R = WG / n4;
  let vb = j * n4 + dv;
  if (r < CV && t0 + r < p.kv_len) { o.v0 = vrow(t0 + r, stride4, vb, z); }
  if (r + R < CV && t0 + r + R < p.kv_len) { o.v1 = vrow(t0 + r + R, stride4, vb, z); }
  if (r + 2u * R < CV && t0 + r + 2u * R < p.kv_len) { o.v2 = vrow(t0 + r + 2u * R, stride4, vb, z); }
  if (r + 3u * R < CV && t0 + r + 3u * R < p.kv_len) { o.v3 = vrow(t0 + r + 3u * R, stride4, vb, z); }

  return o;
}

// chunkOut writes chunk c's partials for query heads h0 .. h0 + g_n - 1,
// which qs holds, from kv (loadKV's).
fn chunkOut(c: u32, h0: u32, g_n: u32, tid: u32, kv: KV) {
  let hd = headDim();
  let n4 = hd >> 2u;
  let t0 = c * CV;
  let zero = vec4<f32>(0.0);
  let lane = tid % LANES;
  let pos = tid / LANES;
  let r = tid / n4;
  let R = WG / n4;
  // Scores.
  for (var g = 0u; g < MAXG; g++) {
    if (g < g_n) {
      var d = dot(q4(g, lane), kv.k0);
      if (lane + LANES < n4) { d += dot(q4(g, lane + LANES), kv.k1); }
      if (lane + 2u * LANES < n4) { d += dot(q4(g, lane + 2u * LANES), kv.k2); }
      if (lane + 3u * LANES < n4) { d += dot(q4(g, lane + 3u * LANES), kv.k3); }
      // Lane l of position pos at l * 32 + (pos + 4l) mod 32: the 32
      // threads of a warp (four positions, eight lanes) write 32 banks,
      // and the sums below read them the same way.
      red[g * WG + lane * 32u + ((pos + 4u * lane) & 31u)] = d;
    }
  }
  workgroupBarrier();
  // Thread (head tid / 32, position tid % 32) sums its position's lanes.
  {
    let g = tid / CV;
    let ps = tid % CV;
    if (g < g_n) {
      var s = NEG;
      if (t0 + ps < p.kv_len) {
        // The eight lanes, laid out above so that a warp's 32 positions
        // read 32 banks (a position's lanes side by side hit one bank
        // eight ways).
        let b = g * WG;
        s = (red[b + (ps & 31u)] + red[b + 32u + ((ps + 4u) & 31u)] + red[b + 64u + ((ps + 8u) & 31u)] + red[b + 96u + ((ps + 12u) & 31u)] +
          red[b + 128u + ((ps + 16u) & 31u)] + red[b + 160u + ((ps + 20u) & 31u)] + red[b + 192u + ((ps + 24u) & 31u)] + red[b + 224u + ((ps + 28u) & 31u)]) * p.scale;
      }
      sc[g * CV + ps] = s;
    }
  }
  workgroupBarrier();

  chunkSoftmax(tid, g_n, t0); // one round: 8 heads of 32 positions

  // Outputs, two heads a round: each thread's weighted rows, then the
  // R groups' sums added for each vec4 of the row.
  for (var g0 = 0u; g0 < g_n; g0 += 2u) {
    for (var u = 0u; u < 2u; u++) {
      let g = g0 + u;
      var a = zero;
      if (g < g_n && r < CV) {
        let w = g * CV + r;
        a = sc[w] * kv.v0;
        if (r + R < CV) { a += sc[w + R] * kv.v1; }
        if (r + 2u * R < CV) { a += sc[w + 2u * R] * kv.v2; }
        if (r + 3u * R < CV) { a += sc[w + 3u * R] * kv.v3; }
      }
      // Component c of thread tid's sum at c * 264 + tid: each store hits
      // 32 banks (a vec4's components side by side, four ways one bank),
      // and the reads below, 264 = 8 mod 32 apart, do too.
      let o = u * 1056u + tid;
      red[o] = a.x;
      red[o + 264u] = a.y;
      red[o + 528u] = a.z;
      red[o + 792u] = a.w;
    }
    workgroupBarrier();
    // Thread (u, d): head g0 + u, dimension d; sums the groups.
    let u = tid / 128u;
    let d = tid % 128u;
    let g = g0 + u;
    if (g < g_n && d < hd) {
      let gr = min(R, CV);
      var s = 0.0;
      for (var i = 0u; i < gr; i++) {
        // group i's thread for vec4 d / 4 is i * n4 + d / 4.
        s += red[u * 1056u + (d % 4u) * 264u + i * n4 + d / 4u];
      }
      writePartial(h0 + g, c, g, d, s);
    }
    workgroupBarrier();
  }
}
