// Top-k expert routing, one workgroup per token.
// mode 0 (Mixtral): select the k largest logits; weights = softmax over them.
// mode 1 (DeepSeek-V3): s = sigmoid(logit); select by s + bias (when
// has_bias), first keeping only the topk_group groups whose two best
// selection scores sum highest (when groups > 1); weights = s / sum(s) *
// scale. Ties go to the lower index. Outputs ids [n_tok][k] (u32) and
// weights [n_tok][k]. n_exp <= 1024, groups <= 64, k <= 32.
//
// The MV flavor (route_mv; lines marked //+MV and //-MV) computes the
// logits itself, the router's product before the routing in one dispatch
// instead of two: one token, logits = rw x (rw [n_exp][cols] f32, x
// [cols] f32, cols a multiple of 4), n_exp <= 16. Each expert's row has
// tpe = 256 / (n_exp rounded up to a power of two) threads, which stride
// over it with eight loads in flight (then four, then one) and meet in a
// tree; the logits are also written to the logits binding. With at most
// 16 experts one thread picks the k in turn.
//
// The MV NORM flavor (route_mv_norm) is route_mv of the FFN's RMSNorm
// of x + o, computed in the same workgroup from x (rx), the o product's
// output (ro) and the norm's weight (rg), so that the router reads
// nothing the norm dispatch writes and both run at once: logit e = (rw_e
// . (x + o) * g) / rms(x + o), a thread a group of 16 values, its share
// of the sum of squares and of every expert's product summed in one
// reduction (the router's rows loaded first). cols a multiple of 16, at
// most 4096; at most 8 experts; no bias.

struct Params {
  n_tok: u32,
  n_exp: u32,
  k: u32,
  mode: u32,
  groups: u32,
  topk_group: u32,
  scale: f32,
  has_bias: u32,
//+MV  cols4: u32,   // vec4s per router row
//+MV  tpe: u32,     // threads per expert (a power of two)
//+MV //-NORM  _m2: u32,
//+NORM  eps: f32,
//+MV  _m3: u32,
}

//-MV @group(0) @binding(0) var<storage, read> logits: array<f32>;
//+MV @group(0) @binding(0) var<storage, read_write> logits: array<f32>;
//+MV @group(0) @binding(4) var<storage, read> rw: array<vec4<f32>>;
//+MV @group(0) @binding(5) var<storage, read> rx: array<vec4<f32>>;
//+NORM @group(0) @binding(6) var<storage, read> ro: array<vec4<f32>>;
//+NORM @group(0) @binding(7) var<storage, read> rg: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
//-MV const MAXE: u32 = 1024u;
//+MV const MAXE: u32 = 16u; // MaxRouterExperts
const NEG: f32 = -3.0e38;
var<workgroup> sel: array<f32, MAXE>;
var<workgroup> base: array<f32, MAXE>;
var<workgroup> rv: array<f32, WG>;
var<workgroup> ri: array<u32, WG>;
var<workgroup> gscore: array<f32, 64>;
var<workgroup> gkeep: array<u32, 64>;
var<workgroup> chosen: array<u32, 32>;
//-MV const MV: bool = false;
//+MV const MV: bool = true;
//-NORM const NORM: bool = false;
//+NORM const NORM: bool = true;
//+NORM const MAXNE: u32 = 8u; // experts
//+NORM var<workgroup> part: array<f32, 2304>; // (MAXNE + 1) * WG
//+NORM var<workgroup> red2: array<f32, 144>; // (MAXNE + 1) * 16
//+NORM var<workgroup> lg: array<f32, 8>; // MAXNE logits

// The routing's mode + 1, its experts and its k where the rule sets them
// (the router's flavors, whose model fixes them), so that the compiler
// folds what depends on them; 0: the params', at run time.
override MODE: u32 = 0u;
override NEXP: u32 = 0u;
override KSEL: u32 = 0u;

fn rmode() -> u32 { return select(p.mode, max(MODE, 1u) - 1u, MODE != 0u); }
fn nExp() -> u32 { return select(p.n_exp, NEXP, NEXP != 0u); }
fn kSel() -> u32 { return select(p.k, KSEL, KSEL != 0u); }
// The MV flavors' vec4s a router row (COLS4) and threads a row (TPE)
// where the rule sets them, 0: the params'.
//+MV override COLS4: u32 = 0u;
//+MV override TPE: u32 = 0u;
//+MV fn cols4() -> u32 { return select(p.cols4, COLS4, COLS4 != 0u); }
//+MV fn tpe() -> u32 { return select(p.tpe, TPE, TPE != 0u); }

fn better(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  return v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let tok = wid.x + wid.y * 65535u;
  if (tok >= p.n_tok) {
    return;
  }
//+MV  if (!NORM) {
//+MV    // The router's product: expert e's row by threads e*tpe.., partial
//+MV    // sums in rv, reduced in segments of tpe.
//+MV    let e = tid / tpe();
//+MV    let lane = tid % tpe();
//+MV    var a = vec4<f32>(0.0);
//+MV    if (e < nExp()) {
//+MV      let row = e * cols4();
//+MV      var i = lane;
//+MV      // Eight loads of the row in flight (one workgroup: registers are
//+MV      // not what limits it, its chain of round trips is), then four.
//+MV      for (; i + 7u * tpe() < cols4(); i += 8u * tpe()) {
//+MV        var wv: array<vec4<f32>, 8>;
//+MV        var xv: array<vec4<f32>, 8>;
//+MV        for (var u = 0u; u < 8u; u++) {
//+MV          wv[u] = rw[row + i + u * tpe()];
//+MV          xv[u] = rx[i + u * tpe()];
//+MV        }
//+MV        a += wv[0] * xv[0] + wv[1] * xv[1] + wv[2] * xv[2] + wv[3] * xv[3];
//+MV        a += wv[4] * xv[4] + wv[5] * xv[5] + wv[6] * xv[6] + wv[7] * xv[7];
//+MV      }
//+MV      for (; i + 3u * tpe() < cols4(); i += 4u * tpe()) {
//+MV        let w0 = rw[row + i];
//+MV        let w1 = rw[row + i + tpe()];
//+MV        let w2 = rw[row + i + 2u * tpe()];
//+MV        let w3 = rw[row + i + 3u * tpe()];
//+MV        let x0 = rx[i];
//+MV        let x1 = rx[i + tpe()];
//+MV        let x2 = rx[i + 2u * tpe()];
//+MV        let x3 = rx[i + 3u * tpe()];
//+MV        a += w0 * x0 + w1 * x1 + w2 * x2 + w3 * x3;
//+MV      }
//+MV      for (; i < cols4(); i += tpe()) {
//+MV        a += rw[row + i] * rx[i];
//+MV      }
//+MV    }
//+MV    rv[tid] = a.x + a.y + a.z + a.w;
//+MV    for (var s = tpe() >> 1u; s > 0u; s >>= 1u) {
//+MV      workgroupBarrier();
//+MV      if (lane < s) {
//+MV        rv[tid] += rv[tid + s];
//+MV      }
//+MV    }
//+MV    workgroupBarrier();
//+MV    if (lane == 0u && e < nExp()) {
//+MV      logits[e] = rv[tid];
//+MV    }
//+MV  }
//+NORM  if (NORM) {
//+NORM    let groups = cols4() / 4u;
//+NORM    let live = tid < groups;
//+NORM    let o4 = 4u * min(tid, groups - 1u);
//+NORM    // The router's rows at the thread's group, loaded first: their
//+NORM    // round trip overlaps x's, o's and the norm weight's.
//+NORM    var wv: array<vec4<f32>, 32>; // 4 * MAXNE
//+NORM    for (var e = 0u; e < MAXNE; e++) {
//+NORM      if (e < nExp()) {
//+NORM        let r = e * cols4() + o4;
//+NORM        wv[4u * e] = rw[r];
//+NORM        wv[4u * e + 1u] = rw[r + 1u];
//+NORM        wv[4u * e + 2u] = rw[r + 2u];
//+NORM        wv[4u * e + 3u] = rw[r + 3u];
//+NORM      }
//+NORM    }
//+NORM    // x + o as the accumulate adds it (x + 1 * o: exact either way),
//+NORM    // and u = (x + o) * g: each logit is 1/rms times the router's row
//+NORM    // by u, so the sum of squares and the rows' products are summed in
//+NORM    // one reduction, with no barrier between the norm and the product.
//+NORM    let v = array<vec4<f32>, 4>(rx[o4] + ro[o4], rx[o4 + 1u] + ro[o4 + 1u], rx[o4 + 2u] + ro[o4 + 2u], rx[o4 + 3u] + ro[o4 + 3u]);
//+NORM    let u = array<vec4<f32>, 4>(v[0] * rg[o4], v[1] * rg[o4 + 1u], v[2] * rg[o4 + 2u], v[3] * rg[o4 + 3u]);
//+NORM    part[tid] = select(0.0, dot(v[0], v[0]) + dot(v[1], v[1]) + dot(v[2], v[2]) + dot(v[3], v[3]), live);
//+NORM    for (var e = 0u; e < MAXNE; e++) {
//+NORM      if (e < nExp()) {
//+NORM        part[(e + 1u) * WG + tid] = select(0.0, dot(wv[4u * e], u[0]) + dot(wv[4u * e + 1u], u[1]) + dot(wv[4u * e + 2u], u[2]) + dot(wv[4u * e + 3u], u[3]), live);
//+NORM      }
//+NORM    }
//+NORM    workgroupBarrier();
//+NORM    // Row r (0: the squares, 1..: the experts) by 16 threads of 16
//+NORM    // values each, then by one thread.
//+NORM    let row = tid / 16u;
//+NORM    let lane = tid % 16u;
//+NORM    if (row <= nExp()) {
//+NORM      var a = 0.0;
//+NORM      for (var i = 0u; i < 16u; i++) {
//+NORM        a += part[row * WG + lane * 16u + i];
//+NORM      }
//+NORM      red2[row * 16u + lane] = a;
//+NORM    }
//+NORM    workgroupBarrier();
//+NORM    if (tid <= nExp()) {
//+NORM      var a = 0.0;
//+NORM      for (var i = 0u; i < 16u; i++) {
//+NORM        a += red2[tid * 16u + i];
//+NORM      }
//+NORM      rv[tid] = a;
//+NORM    }
//+NORM    workgroupBarrier();
//+NORM    // Thread e keeps logit e (lg[e]) for the loop below, where thread
//+NORM    // e reads it (at most 8 experts, a thread each): no barrier.
//+NORM    if (tid < nExp()) {
//+NORM      let l = rv[tid + 1u] / sqrt(rv[0] / f32(cols4() * 4u) + p.eps);
//+NORM      lg[tid] = l;
//+NORM      logits[tid] = l;
//+NORM    }
//+NORM  }
  for (var e = tid; e < nExp(); e += WG) {
//-MV    let l = logits[tok * nExp() + e];
//+MV //-NORM    let l = rv[e * tpe()];
//+NORM    let l = lg[e];
    if (rmode() == 1u) {
      let s = 1.0 / (1.0 + exp(-l));
      base[e] = s;
      var b = 0.0;
      if (p.has_bias == 1u) {
        b = bias[e];
      }
      sel[e] = s + b;
    } else {
      base[e] = l;
      sel[e] = l;
    }
  }
  workgroupBarrier();
  if (rmode() == 1u && p.groups > 1u) {
    let gs = nExp() / p.groups;
    if (tid < p.groups) {
      var b1 = NEG;
      var b2 = NEG;
      for (var i = 0u; i < gs; i++) {
        let v = sel[tid * gs + i];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gscore[tid] = b1 + b2;
      gkeep[tid] = 0u;
    }
    workgroupBarrier();
    if (tid == 0u) {
      for (var j = 0u; j < p.topk_group; j++) {
        var bv = NEG;
        var bi = 0u;
        var found = false;
        for (var g = 0u; g < p.groups; g++) {
          if (gkeep[g] == 0u && (!found || gscore[g] > bv)) {
            bv = gscore[g];
            bi = g;
            found = true;
          }
        }
        gkeep[bi] = 1u;
      }
    }
    workgroupBarrier();
    for (var e = tid; e < nExp(); e += WG) {
      if (gkeep[e / gs] == 0u) {
        sel[e] = NEG;
      }
    }
    workgroupBarrier();
  }
  if (MV) {
    // At most 16 experts: one thread picks the k in turn (the same
    // choices as the tree below, ties to the lower index), instead of ten
    // barriers a choice.
    if (tid == 0u) {
      for (var j = 0u; j < kSel(); j++) {
        var bv = NEG;
        var bi = 0xffffffffu;
        for (var e = 0u; e < nExp(); e++) {
          if (bi == 0xffffffffu || better(sel[e], e, bv, bi)) {
            bv = sel[e];
            bi = e;
          }
        }
        chosen[j] = bi;
        sel[bi] = -3.4e38;
      }
    }
  }
  for (var j = 0u; j < select(kSel(), 0u, MV); j++) {
    var bv = NEG;
    var bi = 0xffffffffu;
    for (var e = tid; e < nExp(); e += WG) {
      if (bi == 0xffffffffu || better(sel[e], e, bv, bi)) {
        bv = sel[e];
        bi = e;
      }
    }
    rv[tid] = bv;
    ri[tid] = bi;
    for (var s = WG >> 1u; s > 0u; s >>= 1u) {
      workgroupBarrier();
      if (tid < s) {
        let ov = rv[tid + s];
        let oi = ri[tid + s];
        if (oi != 0xffffffffu && (ri[tid] == 0xffffffffu || better(ov, oi, rv[tid], ri[tid]))) {
          rv[tid] = ov;
          ri[tid] = oi;
        }
      }
    }
    workgroupBarrier();
    if (tid == 0u) {
      chosen[j] = ri[0];
      sel[ri[0]] = -3.4e38; // taken: below every candidate, masked ones included
    }
    workgroupBarrier();
  }
  if (tid == 0u) {
    var sum = 0.0;
    let m = base[chosen[0]];
    for (var j = 0u; j < kSel(); j++) {
      if (rmode() == 1u) {
        sum += base[chosen[j]];
      } else {
        sum += exp(base[chosen[j]] - m);
      }
    }
    for (var j = 0u; j < kSel(); j++) {
      let c = chosen[j];
      ids[tok * kSel() + j] = c;
      if (rmode() == 1u) {
        weights[tok * kSel() + j] = base[c] / sum * p.scale;
      } else {
        weights[tok * kSel() + j] = exp(base[c] - m) / sum;
      }
    }
  }
}
