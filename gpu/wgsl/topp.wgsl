// Top-p (nucleus) sampling of one token into out[0] (u32), one workgroup.
// p_i = softmax(logits / temperature). The kept set is {i : p_i >= t*},
// t* the largest probability with sum_{p_j >= t*} p_j >= top_p, found by
// binary search over the bits of t (positive floats order as their bits).
// u in [0, 1) then picks, in token order, the first kept token whose
// cumulative kept probability reaches u times the kept mass.

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
var<workgroup> total: f32;
var<workgroup> pick: atomic<u32>;
var<workgroup> last: atomic<u32>;

var<private> m: f32;
var<private> inv_z: f32;

fn prob(i: u32) -> f32 {
  return exp(logits[i] * p.inv_temp - m) * inv_z;
}

// reduce_sum returns the workgroup's sum as a uniform value (the binary
// search below branches on it around barriers).
fn reduce_sum(v: f32, tid: u32) -> f32 {
  workgroupBarrier();
  red[tid] = v;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      red[tid] += red[tid + s];
    }
  }
  workgroupBarrier();
  if (tid == 0u) {
    total = red[0];
  }
  return workgroupUniformLoad(&total);
}

fn mass(t: f32, tid: u32) -> f32 {
  var s = 0.0;
  for (var i = tid; i < p.n; i += WG) {
    let q = prob(i);
    if (q >= t) {
      s += q;
    }
  }
  return reduce_sum(s, tid);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) tid: u32) {
  var mx = -3.0e38;
  for (var i = tid; i < p.n; i += WG) {
    mx = max(mx, logits[i] * p.inv_temp);
  }
  red[tid] = mx;
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      red[tid] = max(red[tid], red[tid + s]);
    }
  }
  workgroupBarrier();
  m = red[0];
  inv_z = 1.0;
  var z = 0.0;
  for (var i = tid; i < p.n; i += WG) {
    z += exp(logits[i] * p.inv_temp - m);
  }
  inv_z = 1.0 / reduce_sum(z, tid);

  var lo = 0u;          // mass(lo) >= top_p
  var hi = 0x3f800001u; // just above 1.0: mass(hi) = 0 < top_p
  for (var it = 0u; it < 32u; it++) {
    if (hi - lo <= 1u) {
      break;
    }
    let mid = lo + (hi - lo) / 2u;
    if (mass(bitcast<f32>(mid), tid) >= p.top_p) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  let t = bitcast<f32>(lo);
  let kept = mass(t, tid);
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
