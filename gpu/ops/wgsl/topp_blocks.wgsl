// Top-p (nucleus) sampling of one token into out[0] (u32), in six
// dispatches of this kernel (stage 0 to 5) over a workgroup per block of
// values. p_i = softmax(logits / temperature). The kept set is
// {i : p_i >= t*}, t* the largest probability with
// sum_{p_j >= t*} p_j >= top_p (tied probabilities are kept together),
// found by a radix select over the probabilities' bits (positive floats
// order as their bits). u in [0, 1) then picks, in token order, the first
// kept token whose cumulative kept probability reaches u times the kept
// mass (the last kept token if rounding leaves the goal above the total).
// One workgroup over all the values took 460 us for 152k of them on the
// H100, one SM's worth of loads six times over.
//
//   stage 0 (a workgroup per block): the block's max and sum of
//           exp(x - max); workgroup 0 clears the histograms.
//   1-3     (a workgroup per block): round r = stage - 1 of the radix
//           select, ten bits a round (a probability is at most 1, so its
//           bits are below 2^30: three rounds). Every workgroup combines
//           the blocks' (max, sum) into the softmax's, takes the select's
//           state after round r - 2 that the previous stage's workgroup 0
//           wrote, finishes round r - 1 from its histogram (the same
//           integers everywhere, so the same digit; workgroup 0 writes the
//           state after it), then adds its block's fixed-point masses to
//           round r's histogram with global atomics.
//   4       (a workgroup per block): round 2 finished: t*; the block's
//           kept mass (f32) and its last kept token.
//   5       (one workgroup): the block where u times the kept mass is
//           reached, in token order, then the token within it; out[0].
//
// The histograms hold fixed-point masses (2^-31 units) summed as integers,
// so their totals do not depend on how the values are split over
// workgroups; the max is exact; the softmax's sum and the pick's f32 sums
// round as f32 does, within what ref.TopP's margin allows.
//
// Scratch s (u32 words): [0, 3072) the three rounds' 1024-bucket
// histograms; [3072, 3084) the select's state after rounds 0, 1, 2
// (chosen bits, mass above them, kept mass, every token kept), four words
// each; [3084, 3086) the softmax's max and 1 / sum that stage 1 keeps
// (SOFT); then from BASE, per block b: its max and sum (f32 bits) at
// BASE + 2b and + 1, its kept mass (f32 bits) at BASE + 2 nb + b, its last
// kept token at BASE + 3 nb + b.

struct Params {
  n: u32,
  inv_temp: f32,
  top_p: f32,
  u: f32,
  stage: u32,
  block: u32, // values per block (a multiple of 256)
  nb: u32,    // blocks
  _p: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> s: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const NB: u32 = 1024u; // buckets a round
const STATE: u32 = 3072u;
const SOFT: u32 = 3084u; // the softmax's max and 1 / sum (f32 bits)
const BASE: u32 = 3088u;
const NONE: u32 = 0xffffffffu;
const FX: f32 = 2147483648.0;
var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;
var<workgroup> redu: array<u32, WG>;
var<workgroup> hist: array<atomic<u32>, NB>;
var<workgroup> sufb: array<u32, NB>; // suffix sums of a round's buckets
var<workgroup> dsel: atomic<u32>;
var<workgroup> pick: atomic<u32>;
var<workgroup> dval: u32;
var<workgroup> keptv: u32;
var<workgroup> carv: u32;
var<workgroup> basev: f32;
var<workgroup> pbv: u32;
var<workgroup> stv: vec4<u32>;

var<private> m: f32;
var<private> inv_z: f32;

fn partAt(b: u32) -> u32 { return BASE + 2u * b; }
fn keptAt(b: u32) -> u32 { return BASE + 2u * p.nb + b; }
fn lastAt(b: u32) -> u32 { return BASE + 3u * p.nb + b; }

fn prob(i: u32) -> f32 {
  return probOf(logits[i]);
}

fn probOf(x: f32) -> f32 {
  return exp(x * p.inv_temp - m) * inv_z;
}

// VPT is the values a thread loads at once in a pass over its block: all
// of them before it uses any, so that their latencies overlap (a loop
// that loaded one value, then hashed it into the histogram with an
// atomic, waited for each load in turn).
const VPT: u32 = 16u;
var<private> xv: array<f32, VPT>;

// loadRun fills xv with values i0 + tid + k WG (k < VPT); those at hi or
// past it read value hi - 1 and are not used.
fn loadRun(i0: u32, hi: u32, tid: u32) {
  for (var k = 0u; k < VPT; k++) {
    xv[k] = logits[min(i0 + tid + k * WG, hi - 1u)];
  }
}

// reduceMaxSum combines the threads' (max, sum of exp(x - max)) pairs in
// red, red2 into red[0], red2[0].
fn reduceMaxSum(tid: u32) {
  for (var st = WG >> 1u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (tid < st) {
      let m1 = red[tid];
      let m2 = red[tid + st];
      let mm = max(m1, m2);
      red2[tid] = red2[tid] * exp(m1 - mm) + red2[tid + st] * exp(m2 - mm);
      red[tid] = mm;
    }
  }
  workgroupBarrier();
}

// softmax sets m and inv_z from the blocks' pairs.
fn softmax(tid: u32) {
  var mx = -3.0e38;
  var zs = 0.0;
  for (var b = tid; b < p.nb; b += WG) {
    let bm = bitcast<f32>(atomicLoad(&s[partAt(b)]));
    let bz = bitcast<f32>(atomicLoad(&s[partAt(b) + 1u]));
    let nm = max(mx, bm);
    zs = zs * exp(mx - nm) + bz * exp(bm - nm);
    mx = nm;
  }
  red[tid] = mx;
  red2[tid] = zs;
  reduceMaxSum(tid);
  m = red[0];
  inv_z = 1.0 / red2[0];
  workgroupBarrier();
}

// scanSum returns the sum of v over the threads up to tid (inclusive),
// through red.
fn scanSum(tid: u32, v: f32) -> f32 {
  workgroupBarrier();
  red[tid] = v;
  workgroupBarrier();
  for (var k = 1u; k < WG; k <<= 1u) {
    var add = 0.0;
    if (tid >= k) {
      add = red[tid - k];
    }
    workgroupBarrier();
    red[tid] += add;
    workgroupBarrier();
  }
  return red[tid];
}

// derive reads round r's histogram and finds the largest bucket d with above + (mass of buckets >= d) >= goal:
// dval = d (NB: none, keep every token), keptv = that mass, carv = the
// mass above bucket d. Thread t holds buckets 4t..4t+3.
fn derive(r: u32, tid: u32, above: u32, goal: u32) {
  var h: array<u32, 4>;
  var own = 0u;
  for (var i = 0u; i < 4u; i++) {
    h[i] = atomicLoad(&s[r * NB + 4u * tid + i]);
    own += h[i];
  }
  redu[tid] = own;
  // Inclusive suffix sums over the threads.
  for (var k = 1u; k < WG; k <<= 1u) {
    workgroupBarrier();
    var add = 0u;
    if (tid + k < WG) {
      add = redu[tid + k];
    }
    workgroupBarrier();
    redu[tid] += add;
  }
  workgroupBarrier();
  var suf = redu[tid] - own; // the buckets of the threads above
  if (tid == 0u) {
    atomicStore(&dsel, 0u);
  }
  var best = 0u;
  for (var i = 3; i >= 0; i--) {
    let j = 4u * tid + u32(i);
    suf += h[i];
    sufb[j] = suf;
    if (best == 0u && above + suf >= goal) {
      best = j + 1u;
    }
  }
  workgroupBarrier();
  if (best != 0u) {
    atomicMax(&dsel, best);
  }
  workgroupBarrier();
  if (tid == 0u) {
    let e = atomicLoad(&dsel);
    if (e == 0u) {
      dval = NB;
      keptv = above + sufb[0];
      carv = keptv;
    } else {
      let d = e - 1u;
      var next = 0u;
      if (d < NB - 1u) {
        next = sufb[d + 1u];
      }
      dval = d;
      keptv = above + sufb[d];
      carv = above + next;
    }
  }
  workgroupBarrier();
}

// advance finishes round r from the state st after the rounds before it
// (chosen bits, mass above them, kept mass, every token kept) and
// returns the state after it; workgroup 0 of the dispatch writes it for
// the next stage.
fn advance(r: u32, st: vec4<u32>, tid: u32, wg: u32) -> vec4<u32> {
  var n = st;
  if (st.w == 0u) {
    derive(r, tid, st.y, u32(min(p.top_p, 1.0) * FX));
    let d = workgroupUniformLoad(&dval);
    n.z = workgroupUniformLoad(&keptv);
    n.y = workgroupUniformLoad(&carv);
    if (d == NB) {
      n.w = 1u;
    } else {
      n.x |= d << (20u - 10u * r);
    }
  }
  if (wg == 0u && tid == 0u) {
    for (var i = 0u; i < 4u; i++) {
      atomicStore(&s[STATE + 4u * r + i], n[i]);
    }
  }
  return n;
}

// stateAfter reads the state after round r that a previous stage wrote
// (uniform across the workgroup, as the barriers after it need).
fn stateAfter(r: u32, tid: u32) -> vec4<u32> {
  if (tid == 0u) {
    stv = vec4<u32>(atomicLoad(&s[STATE + 4u * r]), atomicLoad(&s[STATE + 4u * r + 1u]),
      atomicLoad(&s[STATE + 4u * r + 2u]), atomicLoad(&s[STATE + 4u * r + 3u]));
  }
  return workgroupUniformLoad(&stv);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let lo = wid.x * p.block;
  let hi = min(p.n, lo + p.block);
  if (p.stage == 0u) {
    var mx = -3.0e38;
    var zs = 0.0;
    for (var i0 = lo; i0 < hi; i0 += VPT * WG) {
      loadRun(i0, hi, tid);
      for (var k = 0u; k < VPT; k++) {
        if (i0 + tid + k * WG < hi) {
          let v = xv[k] * p.inv_temp;
          let nm = max(mx, v);
          zs = zs * exp(mx - nm) + exp(v - nm);
          mx = nm;
        }
      }
    }
    red[tid] = mx;
    red2[tid] = zs;
    reduceMaxSum(tid);
    if (tid == 0u) {
      atomicStore(&s[partAt(wid.x)], bitcast<u32>(red[0]));
      atomicStore(&s[partAt(wid.x) + 1u], bitcast<u32>(red2[0]));
    }
    if (wid.x == 0u) {
      for (var j = tid; j < STATE; j += WG) {
        atomicStore(&s[j], 0u);
      }
    }
    return;
  }
  // Stage 1 combines the blocks' pairs into the softmax's max and 1 / sum
  // (every workgroup the same way, so the same bits) and its workgroup 0
  // keeps them at SOFT for the later stages, which then read two words
  // instead of reducing the blocks' pairs again.
  if (p.stage == 1u) {
    softmax(tid);
    if (wid.x == 0u && tid == 0u) {
      atomicStore(&s[SOFT], bitcast<u32>(m));
      atomicStore(&s[SOFT + 1u], bitcast<u32>(inv_z));
    }
  } else {
    if (tid == 0u) {
      stv = vec4<u32>(atomicLoad(&s[SOFT]), atomicLoad(&s[SOFT + 1u]), 0u, 0u);
    }
    let sv = workgroupUniformLoad(&stv);
    m = bitcast<f32>(sv.x);
    inv_z = bitcast<f32>(sv.y);
  }
  if (p.stage <= 3u) {
    let r = p.stage - 1u;
    var st = vec4<u32>(0u);
    if (r >= 2u) {
      st = stateAfter(r - 2u, tid);
    }
    if (r >= 1u) {
      st = advance(r - 1u, st, tid, wid.x);
    }
    if (st.w == 1u) {
      return; // an earlier round kept every token: nothing more to count
    }
    let chosen = st.x;
    let shift = 20u - 10u * r;
    for (var c = tid; c < NB; c += WG) {
      atomicStore(&hist[c], 0u);
    }
    workgroupBarrier();
    // A thread sums its run of values that fall in one bucket before
    // adding it: the small probabilities of a vocabulary's tail share a
    // few buckets, and one atomic a value on them serializes the block.
    var cb = NONE;
    var cs = 0u;
    for (var i0 = lo; i0 < hi; i0 += VPT * WG) {
      loadRun(i0, hi, tid);
      for (var k = 0u; k < VPT; k++) {
        if (i0 + tid + k * WG >= hi) {
          break;
        }
        let q = probOf(xv[k]);
        let bits = bitcast<u32>(q);
        if (r == 0u || (bits >> (shift + 10u)) == (chosen >> (shift + 10u))) {
          let bk = (bits >> shift) & (NB - 1u);
          let v = u32(q * FX + 0.5);
          if (bk == cb) {
            cs += v;
          } else {
            if (cb != NONE) {
              atomicAdd(&hist[cb], cs);
            }
            cb = bk;
            cs = v;
          }
        }
      }
    }
    if (cb != NONE) {
      atomicAdd(&hist[cb], cs);
    }
    workgroupBarrier();
    for (var c = tid; c < NB; c += WG) {
      let h = atomicLoad(&hist[c]);
      if (h != 0u) {
        atomicAdd(&s[r * NB + c], h);
      }
    }
    return;
  }
  var st = vec4<u32>(0u);
  if (p.stage == 4u) {
    st = advance(2u, stateAfter(1u, tid), tid, wid.x);
  } else {
    st = stateAfter(2u, tid);
  }
  var t = bitcast<f32>(st.x);
  if (st.w == 1u) {
    t = 0.0;
  }
  if (p.stage == 4u) {
    var cs = 0.0;
    var lastKept = NONE;
    for (var i0 = lo; i0 < hi; i0 += VPT * WG) {
      loadRun(i0, hi, tid);
      for (var k = 0u; k < VPT; k++) {
        let i = i0 + tid + k * WG;
        if (i < hi) {
          let q = probOf(xv[k]);
          if (q >= t) {
            cs += q;
            lastKept = i; // rising within a thread
          }
        }
      }
    }
    red[tid] = cs;
    redu[tid] = lastKept;
    for (var k = WG >> 1u; k > 0u; k >>= 1u) {
      workgroupBarrier();
      if (tid < k) {
        red[tid] += red[tid + k];
        let o = redu[tid + k];
        if (o != NONE && (redu[tid] == NONE || o > redu[tid])) {
          redu[tid] = o;
        }
      }
    }
    workgroupBarrier();
    if (tid == 0u) {
      atomicStore(&s[keptAt(wid.x)], bitcast<u32>(red[0]));
      atomicStore(&s[lastAt(wid.x)], redu[0]);
    }
    return;
  }

  // Stage 5, one workgroup: first the block, then the token.
  let goal = p.u * (f32(st.z) / FX);
  let per = (p.nb + WG - 1u) / WG; // blocks per thread, contiguous
  let b0 = min(tid * per, p.nb);
  let b1 = min(b0 + per, p.nb);
  var cs = 0.0;
  var lastKept = NONE;
  for (var b = b0; b < b1; b++) {
    cs += bitcast<f32>(atomicLoad(&s[keptAt(b)]));
    let l = atomicLoad(&s[lastAt(b)]);
    if (l != NONE) {
      lastKept = l; // blocks rise with b
    }
  }
  if (tid == 0u) {
    atomicStore(&pick, NONE);
  }
  workgroupBarrier();
  redu[tid] = lastKept;
  let incl = scanSum(tid, cs);
  if (cs > 0.0 && incl >= goal) {
    var cum = incl - cs;
    for (var b = b0; b < b1; b++) {
      let ks = bitcast<f32>(atomicLoad(&s[keptAt(b)]));
      if (ks > 0.0 && cum + ks >= goal) {
        // Blocks are taken in order: the first thread's block wins.
        atomicMin(&pick, b);
        break;
      }
      cum += ks;
    }
  }
  workgroupBarrier();
  // The last kept token of all: the answer when rounding leaves the goal
  // a hair above the total.
  for (var k = WG >> 1u; k > 0u; k >>= 1u) {
    if (tid < k) {
      let o = redu[tid + k];
      if (o != NONE && (redu[tid] == NONE || o > redu[tid])) {
        redu[tid] = o;
      }
    }
    workgroupBarrier();
  }
  if (tid == 0u) {
    pbv = atomicLoad(&pick);
  }
  let pb = workgroupUniformLoad(&pbv);
  let last = redu[0];
  // The prefix of the blocks before pb: the sum over threads' ranges
  // below it (each thread adds its blocks < pb).
  var before = 0.0;
  if (pb != NONE) {
    for (var b = b0; b < min(b1, pb); b++) {
      before += bitcast<f32>(atomicLoad(&s[keptAt(b)]));
    }
  }
  workgroupBarrier();
  red[tid] = before;
  for (var k = WG >> 1u; k > 0u; k >>= 1u) {
    workgroupBarrier();
    if (tid < k) {
      red[tid] += red[tid + k];
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    basev = red[0];
    atomicStore(&pick, NONE);
  }
  let base = workgroupUniformLoad(&basev);
  if (pb == NONE) {
    if (tid == 0u) {
      out[0] = last;
    }
    return;
  }
  // Within block pb: each thread a contiguous chunk.
  let blo = pb * p.block;
  let bhi = min(p.n, blo + p.block);
  let chunk = (bhi - blo + WG - 1u) / WG;
  let a = min(blo + tid * chunk, bhi);
  let e = min(a + chunk, bhi);
  var ccs = 0.0;
  for (var i = a; i < e; i++) {
    let q = prob(i);
    if (q >= t) {
      ccs += q;
    }
  }
  let cincl = base + scanSum(tid, ccs);
  if (ccs > 0.0 && cincl >= goal) {
    var cum = cincl - ccs;
    for (var i = a; i < e; i++) {
      let q = prob(i);
      if (q >= t) {
        cum += q;
        if (cum >= goal) {
          atomicMin(&pick, i);
          break;
        }
      }
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    var r = atomicLoad(&pick);
    if (r == NONE) {
      r = last;
    }
    out[0] = r;
  }
}
