// Top-k expert routing, one workgroup per token (the op's dispatch rule),
// by rank instead of by k rounds of selection. The built-in finds the k
// winners one after the other, a tree reduction over the workgroup each
// (8 barriers a round): a decode step's routing is a chain of k * 8
// barriers. Here every thread ranks its experts at once, counting the
// experts that beat it (higher selection score, or equal and lower index:
// the built-in's tie rule), and an expert of rank r < k is the r-th
// winner. The group-limited selection of DeepSeek-V3 ranks the groups the
// same way. Three barriers in all; the counting stops at k, so an expert
// far from the top costs a few comparisons.
//
// Semantics, ABI and outputs as the built-in route.wgsl: mode 0 (Mixtral)
// weights = softmax over the chosen logits; mode 1 (DeepSeek-V3)
// s = sigmoid(logit), selection by s + bias within the topk_group best
// groups (by the sum of their two best selection scores), weights =
// s / sum(s) * scale. n_exp <= 1024, groups <= 64, k <= 32.

struct Params {
  n_tok: u32,
  n_exp: u32,
  k: u32,
  mode: u32,
  groups: u32,
  topk_group: u32,
  scale: f32,
  has_bias: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const MAXE: u32 = 1024u;
const NEG: f32 = -3.0e38;
var<workgroup> sel: array<f32, MAXE>;
var<workgroup> base: array<f32, MAXE>;
var<workgroup> gscore: array<f32, 64>;
var<workgroup> gkeep: array<u32, 64>;
var<workgroup> chosen: array<u32, 32>;

// beats: expert (or group) j with score w ranks above i with score v.
fn beats(w: f32, j: u32, v: f32, i: u32) -> bool {
  return w > v || (w == v && j < i);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let tok = wid.x + wid.y * 65535u;
  if (tok >= p.n_tok) {
    return;
  }
  let n = p.n_exp;
  let grouped = p.mode == 1u && p.groups > 1u;
  for (var e = tid; e < n; e += WG) {
    let l = logits[tok * n + e];
    if (p.mode == 1u) {
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
  if (grouped) {
    let gs = n / p.groups;
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
    }
    workgroupBarrier();
    if (tid < p.groups) {
      let v = gscore[tid];
      var r = 0u;
      for (var h = 0u; h < p.groups; h++) {
        if (beats(gscore[h], h, v, tid)) {
          r++;
        }
      }
      gkeep[tid] = select(0u, 1u, r < p.topk_group);
    }
    workgroupBarrier();
  }
  // An expert of a dropped group scores NEG, as in the built-in: it can
  // still be chosen (by index) when fewer than k experts remain.
  for (var e = tid; e < n; e += WG) {
    var v = sel[e];
    if (grouped && gkeep[e / (n / p.groups)] == 0u) {
      v = NEG;
    }
    var r = 0u;
    for (var f = 0u; f < n && r < p.k; f++) {
      var w = sel[f];
      if (grouped && gkeep[f / (n / p.groups)] == 0u) {
        w = NEG;
      }
      if (beats(w, f, v, e)) {
        r++;
      }
    }
    if (r < p.k) {
      chosen[r] = e;
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    var sum = 0.0;
    let m = base[chosen[0]];
    for (var j = 0u; j < p.k; j++) {
      if (p.mode == 1u) {
        sum += base[chosen[j]];
      } else {
        sum += exp(base[chosen[j]] - m);
      }
    }
    for (var j = 0u; j < p.k; j++) {
      let c = chosen[j];
      ids[tok * p.k + j] = c;
      if (p.mode == 1u) {
        weights[tok * p.k + j] = base[c] / sum * p.scale;
      } else {
        weights[tok * p.k + j] = exp(base[c] - m) / sum;
      }
    }
  }
}
