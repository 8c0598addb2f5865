// Rotary position embedding, in place on x [n_tok][n_heads][head_dim]: the
// first rot elements of each head turn by (pos0 + t) * freqs[i], i < rot/2.
// style 0 (NeoX) pairs i with i + rot/2; style 1 (GPT-J) pairs 2i with 2i+1.
// freqs come from the CPU (float64 rounded to f32), so scaled variants
// (YaRN, Llama 3) need no kernel change.
//
// The KV flavor (kernel rope_kv; lines marked //+KV) is a decode step's
// RoPE and cache store in one dispatch, for one token: heads kh0.. of x
// are its k heads, whose rotated pairs also go to row kpos of the k cache
// kc; threads past the pairs copy the k heads' unrotated elements (rot <
// head_dim) and the v row (kvn floats at v_off of x) to row kpos of kc
// and vc.

struct Params {
  n_tok: u32,
  n_heads: u32,
  head_dim: u32,
  rot: u32,
  pos0: u32,
  style: u32,
  gx: u32,
//+KV  kh0: u32,   // first k head
//+KV  kvn: u32,   // floats of a cache row: the k heads', and v's
//+KV  v_off: u32, // where v starts in x
//+KV  kpos: u32,  // the cache row
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> freqs: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;
//+KV @group(0) @binding(2) var<storage, read_write> kc: array<f32>;
//+KV @group(0) @binding(3) var<storage, read_write> vc: array<f32>;

// 2*pi split so that k*TWO_PI_HI is exact for k < 2^16.
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.0019353071795864769;
const INV_TWO_PI: f32 = 0.15915494309189535;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let g = (wid.x + wid.y * p.gx) * 256u + tid;
  let half = p.rot / 2u;
  let per_tok = p.n_heads * half;
  if (g >= p.n_tok * per_tok) {
//+KV    store(g - p.n_tok * per_tok);
    return;
  }
  let t = g / per_tok;
  let rem = g % per_tok;
  let h = rem / half;
  let i = rem % half;
  let base = (t * p.n_heads + h) * p.head_dim;
  var ia = base + i;
  var ib = base + i + half;
  if (p.style == 1u) {
    ia = base + 2u * i;
    ib = ia + 1u;
  }
  // Reduce the angle to [-pi, pi] before cos/sin: GPU sin and cos lose
  // accuracy on large arguments.
  let ang = f32(p.pos0 + t) * freqs[i];
  let k = round(ang * INV_TWO_PI);
  let r = (ang - k * TWO_PI_HI) - k * TWO_PI_LO;
  let c = cos(r);
  let s = sin(r);
  let a = x[ia];
  let b = x[ib];
  x[ia] = a * c - b * s;
  x[ib] = a * s + b * c;
//+KV  if (h >= p.kh0) {
//+KV    let row = p.kpos * p.kvn + (h - p.kh0) * p.head_dim;
//+KV    kc[row + ia - base] = a * c - b * s;
//+KV    kc[row + ib - base] = a * s + b * c;
//+KV  }
}
//+KV
//+KV // store copies element j of the cache rows that no pair thread wrote:
//+KV // the k heads' elements past rot (j < kvn), then v (j - kvn < kvn).
//+KV fn store(j: u32) {
//+KV   if (j < p.kvn) {
//+KV     if (j % p.head_dim >= p.rot) {
//+KV       kc[p.kpos * p.kvn + j] = x[p.kh0 * p.head_dim + j];
//+KV     }
//+KV   } else if (j < 2u * p.kvn) {
//+KV     vc[p.kpos * p.kvn + j - p.kvn] = x[p.v_off + j - p.kvn];
//+KV   }
//+KV }
