// Top-p (nucleus) sampling of one token into out[0] (u32), one workgroup.
// p_i = softmax(logits / temperature). The kept set is {i : p_i >= t*},
// t* the largest probability with sum_{p_j >= t*} p_j >= top_p, found by a
// radix select over the bits of the probabilities (positive floats order
// as their bits), eight bits a pass: four passes over the vocabulary, each
// a histogram of the probability mass of the values that share the bits
// chosen so far (a binary search took 31 passes). The histogram's sums, and
// the kept mass they give, are fixed point (2^-31 units: workgroup atomics
// add integers), an error below 2^-32 a value; the pick sums in f32.
// u in [0, 1) then picks, in token order, the first kept token whose
// cumulative kept probability reaches u times the kept mass. Six passes
// over the vocabulary in all: max and sum together, four rounds, the pick.

struct Params {
  n: u32,
  inv_temp: f32,
  top_p: f32,
  u: f32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;
var<workgroup> red2: array<f32, WG>;
var<workgroup> pick: atomic<u32>;
var<workgroup> last: atomic<u32>;
// Four copies of the 256 buckets (a thread adds to copy tid % 4): fewer
// threads contend for one bucket's atomic.
var<workgroup> hist: array<atomic<u32>, 1024>;
var<workgroup> digit: u32;
var<workgroup> carried: u32;
var<workgroup> keptw: u32;

var<private> m: f32;
var<private> inv_z: f32;

fn prob(i: u32) -> f32 {
  return exp(logits[i] * p.inv_temp - m) * inv_z;
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
  // The max and the sum of exp(x - max) in one pass ("online": the sum is
  // rescaled when the max grows), then the workgroup's pairs combined.
  var mx = -3.0e38;
  var zs = 0.0;
  for (var i = tid; i < p.n; i += WG) {
    let v = logits[i] * p.inv_temp;
    let nm = max(mx, v);
    zs = zs * exp(mx - nm) + exp(v - nm);
    mx = nm;
  }
  red[tid] = mx;
  red2[tid] = zs;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      let m1 = red[tid];
      let m2 = red[tid + s];
      let mm = max(m1, m2);
      red2[tid] = red2[tid] * exp(m1 - mm) + red2[tid + s] * exp(m2 - mm);
      red[tid] = mm;
    }
  }
  workgroupBarrier();
  m = red[0];
  inv_z = 1.0 / red2[0];
  workgroupBarrier();

  // Radix select of t*'s bits, the highest byte first. above: the mass
  // (fixed point) of the values above every pattern that starts with the
  // bits chosen so far.
  let goal_fx = u32(min(p.top_p, 1.0) * 2147483648.0);
  var chosen = 0u; // t*'s bits chosen so far
  var above = 0u;
  var kept_fx = 0u;
  var all = false;
  for (var round = 0u; round < 4u; round++) {
    let shift = 24u - 8u * round;
    for (var c = 0u; c < 4u; c++) {
      atomicStore(&hist[c * 256u + tid], 0u);
    }
    workgroupBarrier();
    for (var i = tid; i < p.n; i += WG) {
      let q = prob(i);
      let bits = bitcast<u32>(q);
      // The bits above this pass's byte must be those chosen so far.
      if (round == 0u || (bits >> (shift + 8u)) == (chosen >> (shift + 8u))) {
        atomicAdd(&hist[(tid & 3u) * 256u + ((bits >> shift) & 255u)], u32(q * 2147483648.0 + 0.5));
      }
    }
    workgroupBarrier();
    if (tid == 0u) {
      // The largest byte d whose bucket, with the mass above it, reaches
      // the goal; none (top_p beyond what the sums hold, only possible in
      // the first round): 256, keep every token.
      var acc = above;
      var d = 256u;
      var kept = 0u;
      for (var j = 255; j >= 0; j--) {
        let b = u32(j);
        let h = atomicLoad(&hist[b]) + atomicLoad(&hist[256u + b]) + atomicLoad(&hist[512u + b]) + atomicLoad(&hist[768u + b]);
        if (acc + h >= goal_fx) {
          d = b;
          kept = acc + h;
          break;
        }
        acc += h;
      }
      if (d == 256u) {
        kept = acc;
      }
      digit = d;
      carried = acc;
      keptw = kept;
    }
    let d = workgroupUniformLoad(&digit);
    above = workgroupUniformLoad(&carried);
    kept_fx = workgroupUniformLoad(&keptw);
    if (d == 256u) {
      all = true;
      break;
    }
    chosen |= d << shift;
  }
  // After the last round, kept_fx is the mass of the values >= t*: those
  // above its pattern and those equal to it.
  var t = bitcast<f32>(chosen);
  if (all) {
    t = 0.0;
  }
  let kept = f32(kept_fx) / 2147483648.0;
  let goal = p.u * kept;

  // Each thread owns a contiguous chunk; exclusive prefix of chunk sums.
  let chunk = (p.n + WG - 1u) / WG;
  let a = min(tid * chunk, p.n);
  let b = min(a + chunk, p.n);
  var cs = 0.0;
  var lastKept = 0xffffffffu;
  for (var i = a; i < b; i++) {
    let q = prob(i);
    if (q >= t) {
      cs += q;
      lastKept = i;
    }
  }
  if (tid == 0u) {
    atomicStore(&pick, 0xffffffffu);
    atomicStore(&last, 0u);
  }
  workgroupBarrier();
  red[tid] = cs;
  workgroupBarrier();
  // Hillis-Steele inclusive scan.
  for (var s = 1u; s < WG; s <<= 1u) {
    var add = 0.0;
    if (tid >= s) {
      add = red[tid - s];
    }
    workgroupBarrier();
    red[tid] += add;
    workgroupBarrier();
  }
  let incl = red[tid];
  let prefix = incl - cs;
  if (lastKept != 0xffffffffu) {
    atomicMax(&last, lastKept);
  }
  if (cs > 0.0 && incl >= goal) {
    // This chunk reaches the goal: scan it.
    var cum = prefix;
    var found = 0xffffffffu;
    for (var i = a; i < b; i++) {
      let q = prob(i);
      if (q >= t) {
        cum += q;
        if (cum >= goal) {
          found = i;
          break;
        }
      }
    }
    if (found != 0xffffffffu) {
      atomicMin(&pick, found);
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    var r = atomicLoad(&pick);
    if (r == 0xffffffffu) {
      r = atomicLoad(&last);
    }
    out[0] = r;
  }
}
