// Dense matrix-vector (TOK = 1) or small-batch product with f32 (W_F16 = 0)
// or f16 (W_F16 = 1) weights: y[t][r] = sum_k W[r][k] * x[t][k].
// A workgroup of 256 threads handles ROWS rows (x read once for all of
// them) and strides over the row in 16-byte units when the row length
// allows (vec = 1: cols % 4 == 0 for f32, cols % 8 == 0 for f16), else one
// element at a time. Partial sums meet in a tree over the workgroup.

struct Params {
  rows: u32,
  cols: u32,
  n: u32,     // tokens
  gx: u32,    // workgroups along x
  vec: u32,   // 1: 16-byte path
//+PART  eps: f32,
//+PART  nparts: u32,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;
//+PART @group(0) @binding(3) var<storage, read> part: array<f32>;

// The PART flavor (dense_matmul_part) is a product of an RMSNorm's output
// without its dispatch, as q4k_matmul's PART: x holds x * g, part nparts
// partial sums of x^2 (accumulate's NORM wrote both); each row is scaled
// by 1 / sqrt(sum(part) / cols + eps). One token.
//-PART fn rms() -> f32 { return 1.0; }
//+PART fn rms() -> f32 {
//+PART   var ssq = 0.0;
//+PART   for (var i = 0u; i < min(p.nparts, 64u); i++) { // 64: ops.MaxParts
//+PART     ssq += part[i];
//+PART   }
//+PART   return inverseSqrt(ssq / f32(p.cols) + p.eps);
//+PART }

override ROWS: u32 = 2u;
override TOK: u32 = 1u;
override W_F16: u32 = 0u;
const WG: u32 = 256u;

const RT: u32 = ROWS * TOK; // accumulators per thread
const RED: u32 = WG * RT;
var<workgroup> red: array<f32, RED>;

fn x_at(e: u32) -> f32 {
  return x[e >> 2u][e & 3u];
}

fn w_at(e: u32) -> f32 {
  if (W_F16 == 0u) {
    return bitcast<f32>(w[e >> 2u][e & 3u]);
  }
  let word = e >> 1u;
  return unpack2x16float(w[word >> 2u][word & 3u])[e & 1u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let wg = wid.x + wid.y * p.gx;
  let row0 = wg * ROWS;
  let tok0 = wid.z * TOK;
  var acc: array<f32, RT>;
  for (var i = 0u; i < RT; i++) {
    acc[i] = 0.0;
  }
  if (p.vec == 1u) {
    let per = select(4u, 8u, W_F16 == 1u); // weights per 16-byte unit
    let units = p.cols / per;
    for (var u = tid; u < units; u += WG) {
      var xa: array<vec4<f32>, TOK>;
      var xb: array<vec4<f32>, TOK>;
      for (var t = 0u; t < TOK; t++) {
        let tt = min(tok0 + t, p.n - 1u);
        let o = (tt * p.cols) / 4u + u * (per / 4u);
        xa[t] = x[o];
        if (W_F16 == 1u) {
          xb[t] = x[o + 1u];
        }
      }
      for (var r = 0u; r < ROWS; r++) {
        let row = min(row0 + r, p.rows - 1u);
        let wv = w[(row * p.cols) / per + u];
        for (var t = 0u; t < TOK; t++) {
          if (W_F16 == 0u) {
            acc[r * TOK + t] += dot(bitcast<vec4<f32>>(wv), xa[t]);
          } else {
            let w0 = vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
            let w1 = vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w));
            acc[r * TOK + t] += dot(w0, xa[t]) + dot(w1, xb[t]);
          }
        }
      }
    }
  } else {
    for (var k = tid; k < p.cols; k += WG) {
      for (var r = 0u; r < ROWS; r++) {
        let row = min(row0 + r, p.rows - 1u);
        let wv = w_at(row * p.cols + k);
        for (var t = 0u; t < TOK; t++) {
          let tt = min(tok0 + t, p.n - 1u);
          acc[r * TOK + t] += wv * x_at(tt * p.cols + k);
        }
      }
    }
  }
  for (var i = 0u; i < RT; i++) {
    red[i * WG + tid] = acc[i];
  }
  for (var s = WG >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (tid < s) {
      for (var i = 0u; i < RT; i++) {
        red[i * WG + tid] += red[i * WG + tid + s];
      }
    }
  }
  if (tid == 0u) {
    let rs = rms();
    for (var r = 0u; r < ROWS; r++) {
      for (var t = 0u; t < TOK; t++) {
        let row = row0 + r;
        let tt = tok0 + t;
        if (row < p.rows && tt < p.n) {
          y[tt * p.rows + row] = red[(r * TOK + t) * WG + tid] * rs;
        }
      }
    }
  }
}
