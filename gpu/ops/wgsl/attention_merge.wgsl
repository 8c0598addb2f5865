// Decode attention, pass 2 of 2 (see attention_split): workgroup (h, b)
// merges query head h's chunk partials for dimensions 32b .. 32b + 31,
// out[h][d] = sum_c exp(m_c - M) acc_c[d] / sum_c exp(m_c - M) l_c with M
// the largest chunk max. A merge is a chain of latencies, not a stream of
// bytes (a few MB of partials), so it is spread wide (a workgroup per head
// and 32 dimensions) and made of one round of loads and one tree: thread
// (column, group) merges four consecutive dimensions of the chunks of its
// group (chunks group, group + 32, ...) online (its own max, rescaling its
// sums as the max rises), eight chunks' loads at once; then the 32 groups
// of each column meet in five steps of a tree, each pair rescaled to the
// larger max. hd <= 256. It replaced a merge that first reduced the
// chunks' maxima over the workgroup, then kept their weights in workgroup
// memory and summed: three rounds of loads and 26 barriers instead of one
// and six.
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

// The head dimension, which the rule sets, so that the partials' row and
// the dimensions' offsets fold; 0: p.hd's, at run time.
override HD: u32 = 0u;

const WG: u32 = 256u;
const BATCH: u32 = 8u;  // chunks a thread loads at once
const COLS: u32 = 8u;   // threads across the 32 dimensions, four each
const GROUPS: u32 = WG / COLS;
const NEG: f32 = -3.0e38;

var<workgroup> mm: array<f32, WG>;
var<workgroup> ll: array<f32, WG>;
var<workgroup> acc: array<vec4<f32>, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let h = wid.x;
  let hd = select(p.hd, HD, HD != 0u);
  let nc = p.n_chunks;
  let row = hd + 2u;
  let base = h * nc * row;
  let col = tid % COLS;
  let grp = tid / COLS;
  let d0 = min(wid.y * 32u + 4u * col, hd - 4u); // this thread's first dimension
  let live = wid.y * 32u + 4u * col < hd;

  // Thread (col, grp) merges chunks grp, grp + GROUPS, ... online: its
  // own max M, sum L and outputs A, rescaled as a batch raises M. A
  // batch's loads are all issued before any is used (a chunk past the
  // last reads the last one again and counts as empty).
  var M = NEG;
  var L = 0.0;
  var A = vec4<f32>(0.0);
  for (var i = grp; i < nc; i += BATCH * GROUPS) {
    var ms: array<f32, BATCH>;
    var ls: array<f32, BATCH>;
    var xs: array<vec4<f32>, BATCH>;
    for (var u = 0u; u < BATCH; u++) {
      let c = i + u * GROUPS;
      let at = base + min(c, nc - 1u) * row;
      ms[u] = select(NEG, part[at], c < nc);
      ls[u] = part[at + 1u];
      let xo = at + 2u + d0;
      xs[u] = vec4<f32>(part[xo], part[xo + 1u], part[xo + 2u], part[xo + 3u]);
    }
    var mb = M;
    for (var u = 0u; u < BATCH; u++) {
      mb = max(mb, ms[u]);
    }
    let r = exp(M - mb);
    L *= r;
    A *= r;
    for (var u = 0u; u < BATCH; u++) {
      let w = exp(ms[u] - mb);
      L += w * ls[u];
      A += w * xs[u];
    }
    M = mb;
  }
  // The GROUPS threads of a column meet in a tree of five steps, each
  // pair rescaled to the larger max.
  mm[tid] = M;
  ll[tid] = L;
  acc[tid] = A;
  for (var st = GROUPS / 2u; st > 0u; st >>= 1u) {
    workgroupBarrier();
    if (grp < st) {
      let t = tid + st * COLS;
      let ma = mm[tid];
      let mb = mm[t];
      let mx = max(ma, mb);
      let ra = exp(ma - mx);
      let rb = exp(mb - mx);
      mm[tid] = mx;
      ll[tid] = ll[tid] * ra + ll[t] * rb;
      acc[tid] = acc[tid] * ra + acc[t] * rb;
    }
  }
  workgroupBarrier();
  if (grp == 0u && live) {
    let s = acc[col] / ll[col];
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
