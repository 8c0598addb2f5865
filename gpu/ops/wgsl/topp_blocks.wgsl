// Top-p (nucleus) sampling of one token into out[0] (u32), in five
// dispatches of this kernel (stage 0 to 4) over a workgroup per block of
// values. p_i = softmax(logits / temperature). The kept set is
// {i : p_i >= t*}, t* the largest probability with
// sum_{p_j >= t*} p_j >= top_p (tied probabilities are kept together),
// found by a radix select over the probabilities' bits (positive floats
// order as their bits). u in [0, 1) then picks, in token order, the first
// kept token whose cumulative kept probability reaches u times the kept
// mass (the last kept token of the last block with kept mass if rounding
// leaves the goal above the total). One workgroup over all the values took
// 460 us for 152k of them on the H100, one SM's worth of loads six times
// over. Five dependent dispatches of this kernel that return at once take
// ~15-17 us there, so the stages are few.
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
//   3       also writes what the pick needs of its block, so that no stage
//           of its own sums the blocks' kept masses: the mass (f32) of its
//           tokens above the 20 bits that rounds 0 and 1 chose (all of
//           them if those rounds kept every token), and the suffix sums of
//           its own round-2 histogram (fixed point): whatever digit round 2
//           ends on, the block's kept mass is the one plus an entry of the
//           other.
//   4       (one workgroup): round 2 finished: t*; the blocks' kept masses;
//           the block where u times the kept mass is reached, in token
//           order, then the token within it; out[0].
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
// BASE + 2b and + 1, its mass above the 20 chosen bits (f32 bits) at
// BASE + 2 nb + b, and its round-2 suffix sums (NB words: entry d is the
// mass of its tokens in the chosen 20 bits whose last ten are >= d) at
// BASE + 3 nb + NB b. The host keeps nb <= 128 (ops.TopPLaunches widens the
// blocks past that), so this stays a few hundred KiB and stage 4 gives a
// thread a block.

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
var<workgroup> softv: vec2<u32>;

var<private> m: f32;
var<private> inv_z: f32;

fn partAt(b: u32) -> u32 { return BASE + 2u * b; }
fn aboveAt(b: u32) -> u32 { return BASE + 2u * p.nb + b; }
fn sufAt(b: u32) -> u32 { return BASE + 3u * p.nb + NB * b; }

fn probOf(x: f32) -> f32 {
  return exp(x * p.inv_temp - m) * inv_z;
}

// VPT is the values a thread loads at once in a pass over its block: all
// of them before it uses any, so that their latencies overlap (a loop
// that loaded one value, then hashed it into the histogram with an
// atomic, waited for each load in turn).
const VPT: u32 = 8u;
var<private> xv: array<f32, VPT>;

// loadRun fills xv with values i0 + tid + k WG (k < VPT); those at hi or
// past it read value hi - 1 and are not used.
fn loadRun(i0: u32, hi: u32, tid: u32) {
  for (var k = 0u; k < VPT; k++) {
    xv[k] = logits[min(i0 + tid + k * WG, hi - 1u)];
  }
}

// The workgroup's sums, maxima and scans go in two levels: a thread of
// each group of GS combines its group's values, then every thread
// combines the NG groups' (three barriers, where a tree took log2(WG)
// steps of a barrier and a round trip through workgroup memory each).
const GS: u32 = 8u;
const NG: u32 = WG / GS;
var<workgroup> grpf: array<f32, NG>;
var<workgroup> grpu: array<u32, NG>;

// sumAll returns the sum of v over the threads, the same bits in every
// thread, through red.
fn sumAll(tid: u32, v: f32) -> f32 {
  workgroupBarrier();
  red[tid] = v;
  workgroupBarrier();
  if (tid < NG) {
    var t = 0.0;
    for (var j = 0u; j < GS; j++) {
      t += red[tid * GS + j];
    }
    grpf[tid] = t;
  }
  workgroupBarrier();
  var t = 0.0;
  for (var g = 0u; g < NG; g++) {
    t += grpf[g];
  }
  return t;
}

// maxAll returns the largest v over the threads, through red.
fn maxAll(tid: u32, v: f32) -> f32 {
  workgroupBarrier();
  red[tid] = v;
  workgroupBarrier();
  if (tid < NG) {
    var t = red[tid * GS];
    for (var j = 1u; j < GS; j++) {
      t = max(t, red[tid * GS + j]);
    }
    grpf[tid] = t;
  }
  workgroupBarrier();
  var t = grpf[0];
  for (var g = 1u; g < NG; g++) {
    t = max(t, grpf[g]);
  }
  return t;
}

// maxSum combines the threads' (max, sum of exp(x - max)) pairs into the
// workgroup's (max, sum of exp(x - max)).
fn maxSum(tid: u32, mx: f32, zs: f32) -> vec2<f32> {
  let mm = maxAll(tid, mx);
  return vec2<f32>(mm, sumAll(tid, zs * exp(mx - mm)));
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
  let mz = maxSum(tid, mx, zs);
  m = mz.x;
  inv_z = 1.0 / mz.y;
}

// scanSum returns the sum of v over the threads up to tid (inclusive),
// through red. For v >= 0 it never falls from one thread to the next: a
// thread adds the values of its group up to it in the order its group's
// total was summed, and the totals of the groups before in order, so the
// last thread of a group and the next group's start round the same sums.
fn scanSum(tid: u32, v: f32) -> f32 {
  workgroupBarrier();
  red[tid] = v;
  workgroupBarrier();
  let g = tid / GS;
  if (tid < NG) {
    var t = 0.0;
    for (var j = 0u; j < GS; j++) {
      t += red[tid * GS + j];
    }
    grpf[tid] = t;
  }
  var own = 0.0;
  for (var j = g * GS; j <= tid; j++) {
    own += red[j];
  }
  workgroupBarrier();
  var before = 0.0;
  for (var q = 0u; q < g; q++) {
    before += grpf[q];
  }
  return before + own;
}

// maxU returns the largest v over the threads, through redu.
fn maxU(tid: u32, v: u32) -> u32 {
  workgroupBarrier();
  redu[tid] = v;
  workgroupBarrier();
  if (tid < NG) {
    var t = 0u;
    for (var j = 0u; j < GS; j++) {
      t = max(t, redu[tid * GS + j]);
    }
    grpu[tid] = t;
  }
  workgroupBarrier();
  var t = 0u;
  for (var g = 0u; g < NG; g++) {
    t = max(t, grpu[g]);
  }
  return t;
}

// sufU returns the sum of v over the threads from tid on (inclusive),
// through redu.
fn sufU(tid: u32, v: u32) -> u32 {
  workgroupBarrier();
  redu[tid] = v;
  workgroupBarrier();
  let g = tid / GS;
  if (tid < NG) {
    var t = 0u;
    for (var j = 0u; j < GS; j++) {
      t += redu[tid * GS + j];
    }
    grpu[tid] = t;
  }
  var own = 0u;
  for (var j = tid; j < (g + 1u) * GS; j++) {
    own += redu[j];
  }
  workgroupBarrier();
  for (var q = g + 1u; q < NG; q++) {
    own += grpu[q];
  }
  return own;
}

// histWords loads round r's histogram buckets 4 tid .. 4 tid + 3.
fn histWords(r: u32, tid: u32) -> array<u32, 4> {
  var h: array<u32, 4>;
  for (var i = 0u; i < 4u; i++) {
    h[i] = atomicLoad(&s[r * NB + 4u * tid + i]);
  }
  return h;
}

// derive takes a round's histogram (thread t's buckets 4t..4t+3, hin)
// and finds the largest bucket d with above + (mass of buckets >= d) >=
// goal: dval = d (NB: none, keep every token), keptv = that mass, carv =
// the mass above bucket d.
fn derive(hin: array<u32, 4>, tid: u32, above: u32, goal: u32) {
  var h = hin; // a var: a value array takes only constant indices
  var own = 0u;
  for (var i = 0u; i < 4u; i++) {
    own += h[i];
  }
  var suf = sufU(tid, own) - own; // the buckets of the threads above
  if (tid == 0u) {
    atomicStore(&dsel, 0u);
  }
  // The buckets that reach the goal are 0..d (suffix sums fall with the
  // bucket): one thread holds d, the one whose buckets reach it and whose
  // next thread's do not, and it alone writes d.
  let reachedAbove = above + suf >= goal; // bucket 4 tid + 4 reaches it
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
  if (best != 0u && !reachedAbove) {
    atomicStore(&dsel, best);
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

// goalFX is top-p in fixed point, at least one unit (a goal of 0 would be
// reached by every bucket, the empty ones above the largest value too).
fn goalFX() -> u32 {
  return max(u32(min(p.top_p, 1.0) * FX), 1u);
}

// advance finishes round r from the state st after the rounds before it
// (chosen bits, mass above them, kept mass, every token kept) and
// returns the state after it; workgroup 0 of the dispatch writes it for
// the next stage.
fn advance(r: u32, st: vec4<u32>, h: array<u32, 4>, tid: u32, wg: u32) -> vec4<u32> {
  var n = st;
  if (st.w == 0u) {
    derive(h, tid, st.y, goalFX());
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

// stateWords loads the state after round r that a previous stage wrote.
fn stateWords(r: u32) -> vec4<u32> {
  return vec4<u32>(atomicLoad(&s[STATE + 4u * r]), atomicLoad(&s[STATE + 4u * r + 1u]),
    atomicLoad(&s[STATE + 4u * r + 2u]), atomicLoad(&s[STATE + 4u * r + 3u]));
}

// loadChunk fills xv with values c0 + k (k < VPT); those at e or past it
// read value e - 1 and are not used.
fn loadChunk(c0: u32, e: u32) {
  for (var k = 0u; k < VPT; k++) {
    xv[k] = logits[min(c0 + k, e - 1u)];
  }
}

// blockPart writes, for round 2's block b, its mass above the chosen 20
// bits (above: each thread's part) and the suffix sums of its round-2
// histogram (in hist), which stage 4 reads instead of passing over the
// values again: block b's kept mass is above + suffix[d2] / 2^31.
fn blockPart(above: f32, tid: u32, b: u32) {
  let a = sumAll(tid, above);
  if (tid == 0u) {
    atomicStore(&s[aboveAt(b)], bitcast<u32>(a));
  }
  // Thread t holds buckets 4t..4t+3; inclusive suffix sums over threads.
  var h: array<u32, 4>;
  var own = 0u;
  for (var i = 0u; i < 4u; i++) {
    h[i] = atomicLoad(&hist[4u * tid + i]);
    own += h[i];
  }
  var suf = sufU(tid, own) - own;
  for (var i = 3; i >= 0; i--) {
    suf += h[i];
    sufb[4u * tid + u32(i)] = suf;
  }
  workgroupBarrier();
  // Thread t writes words t, t + WG, ...: a warp's stores side by side.
  for (var c = tid; c < NB; c += WG) {
    atomicStore(&s[sufAt(b) + c], sufb[c]);
  }
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
      // The run's max first, then its exps: independent of one another,
      // where an online update per value chained them.
      var rm = mx;
      for (var k = 0u; k < VPT; k++) {
        if (i0 + tid + k * WG < hi) {
          rm = max(rm, xv[k] * p.inv_temp);
        }
      }
      var rz = 0.0;
      for (var k = 0u; k < VPT; k++) {
        if (i0 + tid + k * WG < hi) {
          rz += exp(xv[k] * p.inv_temp - rm);
        }
      }
      zs = zs * exp(mx - rm) + rz;
      mx = rm;
    }
    let mz = maxSum(tid, mx, zs);
    if (tid == 0u) {
      atomicStore(&s[partAt(wid.x)], bitcast<u32>(mz.x));
      atomicStore(&s[partAt(wid.x) + 1u], bitcast<u32>(mz.y));
    }
    if (wid.x == 0u) {
      for (var j = tid; j < STATE; j += WG) {
        atomicStore(&s[j], 0u);
      }
    }
    return;
  }
  // The loads of a stage that do not depend on one another go out
  // together, before any is used: the block's first run of values, the
  // histogram of the round the stage finishes, the softmax and the
  // select's state (thread 0); one after another, each was a round trip
  // to memory of its own on the stage's path.
  if (p.stage <= 3u) {
    loadRun(lo, hi, tid);
  }
  var hw: array<u32, 4>;
  var abv = 0u; // stage 4: block tid's mass above the chosen 20 bits
  if (p.stage == 4u && tid < p.nb) {
    abv = atomicLoad(&s[aboveAt(tid)]);
  }
  if (p.stage >= 2u) {
    hw = histWords(p.stage - 2u, tid);
    if (tid == 0u) {
      softv = vec2<u32>(atomicLoad(&s[SOFT]), atomicLoad(&s[SOFT + 1u]));
      if (p.stage >= 3u) {
        stv = stateWords(p.stage - 3u);
      }
    }
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
    let sv = workgroupUniformLoad(&softv);
    m = bitcast<f32>(sv.x);
    inv_z = bitcast<f32>(sv.y);
  }
  if (p.stage <= 3u) {
    let r = p.stage - 1u;
    var st = vec4<u32>(0u);
    if (r >= 2u) {
      st = workgroupUniformLoad(&stv); // the state after round r - 2
    }
    if (r >= 1u) {
      st = advance(r - 1u, st, hw, tid, wid.x);
    }
    // every = an earlier round kept every token: nothing more to count,
    // and in round 2 every token is above.
    let every = st.w == 1u;
    if (every && r < 2u) {
      return;
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
    var above = 0.0; // round 2: the mass above the chosen 20 bits
    for (var i0 = lo; i0 < hi; i0 += VPT * WG) {
      if (i0 != lo) {
        loadRun(i0, hi, tid); // the first run is in xv already
      }
      for (var k = 0u; k < VPT; k++) {
        if (i0 + tid + k * WG >= hi) {
          break;
        }
        let q = probOf(xv[k]);
        let bits = bitcast<u32>(q);
        if (r == 2u && (every || (bits >> 10u) > (chosen >> 10u))) {
          above += q;
          continue;
        }
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
    if (r == 2u) {
      blockPart(above, tid, wid.x);
    }
    return;
  }

  // Stage 4, one workgroup: round 2 finished (t*), the blocks' kept
  // masses, then the block where the goal is reached and the token
  // within it.
  let st1 = workgroupUniformLoad(&stv); // the state after round 1
  var st = st1;
  var d2 = 0u;
  if (st1.w == 0u) {
    derive(hw, tid, st1.y, goalFX());
    // No digit (the rounds' integers disagree, which they should not):
    // keep the chosen 20 bits' every token, digit 0.
    d2 = workgroupUniformLoad(&dval) % NB;
    st.x |= d2;
    st.z = workgroupUniformLoad(&keptv);
  }
  var t = bitcast<f32>(st.x);
  if (st1.w == 1u) {
    t = 0.0;
  }
  let goal = p.u * (f32(st.z) / FX);
  // Thread b takes block b (the host keeps nb <= WG).
  var cs = 0.0;
  if (tid < p.nb) {
    cs = bitcast<f32>(abv);
    if (st1.w == 0u) {
      cs += f32(atomicLoad(&s[sufAt(tid) + d2])) / FX;
    }
  }
  var lastB = 0u; // the last block with kept mass, + 1 (0: none)
  if (cs > 0.0) {
    lastB = tid + 1u;
  }
  if (tid == 0u) {
    atomicStore(&pick, NONE);
  }
  // The scan rises with the thread (see scanSum), so one thread is the
  // first with mass whose sum reaches the goal (a goal of 0, u = 0, is
  // reached before any mass): it alone claims its block.
  let incl = scanSum(tid, cs);
  red2[tid] = incl;
  workgroupBarrier();
  var prev = 0.0;
  if (tid > 0u) {
    prev = red2[tid - 1u];
  }
  if (cs > 0.0 && incl >= goal && (prev < goal || prev == 0.0)) {
    atomicStore(&pick, tid);
    basev = prev;
  }
  workgroupBarrier();
  if (tid == 0u) {
    pbv = atomicLoad(&pick);
    atomicStore(&pick, NONE);
  }
  var pb = workgroupUniformLoad(&pbv);
  let base = workgroupUniformLoad(&basev);
  // lastOnly: rounding left the goal above the total; the answer is the
  // last kept token, in the last block with kept mass.
  let lastOnly = pb == NONE;
  if (lastOnly) {
    pb = max(maxU(tid, lastB), 1u) - 1u; // none: cannot happen (the max is kept)
  }
  // Within block pb: each thread a contiguous chunk, its values loaded
  // VPT at a time before any is used.
  let blo = pb * p.block;
  let bhi = min(p.n, blo + p.block);
  let chunk = (bhi - blo + WG - 1u) / WG;
  let a = min(blo + tid * chunk, bhi);
  let e = min(a + chunk, bhi);
  var ccs = 0.0;
  var lastKept = 0u; // the last kept token + 1 of the chunk (0: none)
  for (var c0 = a; c0 < e; c0 += VPT) {
    loadChunk(c0, e);
    for (var k = 0u; k < VPT; k++) {
      if (c0 + k < e) {
        let q = probOf(xv[k]);
        if (q >= t) {
          ccs += q;
          lastKept = c0 + k + 1u;
        }
      }
    }
  }
  // As for the blocks: the first thread whose sum reaches the goal.
  let cincl = base + scanSum(tid, ccs);
  red2[tid] = cincl;
  workgroupBarrier();
  var cprev = base;
  if (tid > 0u) {
    cprev = red2[tid - 1u];
  }
  if (!lastOnly && ccs > 0.0 && cincl >= goal && (cprev < goal || cprev == 0.0)) {
    var cum = cprev;
    var hit = lastKept - 1u; // rounding may leave the goal past the chunk
    for (var c0 = a; c0 < e; c0 += VPT) {
      if (chunk > VPT) {
        loadChunk(c0, e); // else the chunk is in xv still
      }
      var found = false;
      for (var k = 0u; k < VPT; k++) {
        if (c0 + k < e) {
          let q = probOf(xv[k]);
          if (q >= t) {
            cum += q;
            if (cum >= goal) {
              hit = c0 + k;
              found = true;
              break;
            }
          }
        }
      }
      if (found) {
        break;
      }
    }
    atomicStore(&pick, hit);
  }
  workgroupBarrier();
  if (tid == 0u) {
    pbv = atomicLoad(&pick);
  }
  let r = workgroupUniformLoad(&pbv);
  if (r != NONE) {
    if (tid == 0u) {
      out[0] = r;
    }
    return;
  }
  // No token reached the goal (lastOnly, or the block's sums rounded
  // below the blocks'): the block's last kept token.
  var last = maxU(tid, lastKept) - 1u;
  if (last == NONE) {
    last = blo; // none kept in the block: cannot happen (see above)
  }
  if (tid == 0u) {
    out[0] = last;
  }
}
