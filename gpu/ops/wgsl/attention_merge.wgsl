// Decode attention, pass 2 of 2 (see attention_split): workgroup (h, b)
// merges query head h's chunk partials for dimensions 32b .. 32b + 31,
// out[h][d] = sum_c exp(m_c - M) acc_c[d] / sum_c exp(m_c - M) l_c with M
// the largest chunk max. A merge is a chain of latencies, not a stream of
// bytes (a few MB of partials), so it is spread wide (a workgroup per head
// and 32 dimensions) and keeps its loads in flight together: the chunks'
// maxima are reduced in workgroup memory, their weights kept there (BLK
// chunks at a time); then thread (column, group) sums four consecutive
// dimensions of the chunks of its group (chunks group, group + 32, ...),
// eight chunks' loads at once, and the 32 groups' sums are added in
// workgroup memory. hd <= 256. On the H100 at 4096 positions (32 heads of
// 128, 128 chunks) it takes 9.4 us timed alone, against 12.3 for one
// workgroup a head whose threads walked half the chunks four at a time.
//
// The XQ flavor (attention_merge_xq) also writes out quantized into q for
// the o product's XQ flavor.

struct Params {
  n_heads: u32,
  hd: u32,
  n_chunks: u32,
  _p0: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
//+XQ @group(0) @binding(2) var<storage, read_write> q: array<vec4<u32>>;
//+XQ //#include quantize.inc
//+XQ var<workgroup> outv: array<vec4<f32>, COLS>;
@group(1) @binding(0) var<uniform> p: Params;

const WG: u32 = 256u;
const BLK: u32 = 1024u; // chunk weights kept at a time
const COLS: u32 = 8u;   // threads across the 32 dimensions, four each
const GROUPS: u32 = WG / COLS;
const NEG: f32 = -3.0e38;

var<workgroup> ws: array<f32, BLK>;
var<workgroup> red: array<f32, WG>;
var<workgroup> acc: array<vec4<f32>, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let h = wid.x;
  let hd = p.hd;
  let nc = p.n_chunks;
  let row = hd + 2u;
  let base = h * nc * row;

  // The largest chunk max.
  var m = NEG;
  for (var c = tid; c < nc; c += WG) {
    m = max(m, part[base + c * row]);
  }
  red[tid] = m;
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (tid < st) {
      red[tid] = max(red[tid], red[tid + st]);
    }
  }
  workgroupBarrier();
  let mx = red[0];

  let col = tid % COLS;
  let grp = tid / COLS;
  let d0 = wid.y * 32u + 4u * col; // this thread's first dimension
  let live = d0 < hd;
  var a = vec4<f32>(0.0);
  var l = 0.0;
  for (var c0 = 0u; c0 < nc; c0 += BLK) {
    let n = min(BLK, nc - c0);
    workgroupBarrier();
    for (var c = tid; c < n; c += WG) {
      let at = base + (c0 + c) * row;
      let w = exp(part[at] - mx);
      ws[c] = w;
      l += w * part[at + 1u];
    }
    workgroupBarrier();
    if (live) {
      // Dimensions d0 .. d0 + 3 (hd is a multiple of 4) of chunks grp,
      // grp + GROUPS, ...: eight chunks' loads, then their sums.
      let o0 = base + c0 * row + 2u + d0;
      var i = grp;
      for (; i + 7u * GROUPS < n; i += 8u * GROUPS) {
        var x: array<vec4<f32>, 8>;
        for (var u = 0u; u < 8u; u++) {
          let at = o0 + (i + u * GROUPS) * row;
          x[u] = vec4<f32>(part[at], part[at + 1u], part[at + 2u], part[at + 3u]);
        }
        for (var u = 0u; u < 8u; u++) {
          a += ws[i + u * GROUPS] * x[u];
        }
      }
      for (; i < n; i += GROUPS) {
        let at = o0 + i * row;
        a += ws[i] * vec4<f32>(part[at], part[at + 1u], part[at + 2u], part[at + 3u]);
      }
    }
  }
  // The weighted sums of l over all threads, and of each column's groups.
  workgroupBarrier();
  red[tid] = l;
  acc[tid] = a;
  for (var st = WG / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (tid < st) {
      red[tid] += red[tid + st];
    }
  }
  // Groups: GROUPS / 2, / 4, ... of each column, as the sums above.
  for (var st = GROUPS / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (grp < st) {
      acc[tid] += acc[tid + st * COLS];
    }
  }
  workgroupBarrier();
  if (grp == 0u && live) {
    let s = acc[col] / red[0];
    let ob = h * hd + d0;
    o[ob] = s.x;
    o[ob + 1u] = s.y;
    o[ob + 2u] = s.z;
    o[ob + 3u] = s.w;
//+XQ    outv[col] = s;
  }
//+XQ  // XQ: the workgroup's 32 dimensions quantized too (two groups of 16;
//+XQ  // the Q4_K products' x, see quantize_x.wgsl), hd a multiple of 16.
//+XQ  workgroupBarrier();
//+XQ  if (tid == 0u || tid == 4u) {
//+XQ    if (live) {
//+XQ      quantize(array<vec4<f32>, 4>(outv[tid], outv[tid + 1u], outv[tid + 2u], outv[tid + 3u]), (h * hd + d0) / 16u);
//+XQ    }
//+XQ  }
}
