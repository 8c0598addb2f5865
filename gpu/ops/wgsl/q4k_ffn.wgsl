// A resident MoE layer's feed-forward in one dispatch: for each of the k
// experts the router chose (sel), its gate and up products of quantized x
// with SwiGLU's output quantized into q (phase 1: q4k_matmul.wgsl's
// masked GLU XQ QOUT flavor), then its down product of that q into y
// (phase 2: the masked XQ flavor). The same arithmetic in the same order
// as those two dispatches, so the same bits; what changes is that no
// barrier sits between the phases.
//
// Workgroups take tiles from an atomic counter (ctr[0]): every phase-1
// tile (k * tiles1 of them) before any phase-2 tile. A workgroup that
// takes a phase-2 tile asks for its first block of weights, then waits
// until ctr[1], the phase-1 tiles finished, reaches k * tiles1: a tile of
// phase 1 is only ever held by a running workgroup, so the wait ends
// whatever the grid and however many workgroups fit at once. While the
// last phase-1 tiles finish, the phase-2 workgroups' weights are on their
// way: the tail of one product and the ramp of the other overlap, which a
// barrier between two dispatches forbids. The last workgroup to leave
// (ctr[2] counts them) sets the counters back to zero for the next
// dispatch.
//
// Layout (both phases): 8 threads a block, SPR block slots a row group,
// ROWS rows a thread (phase 1: ROWS / 2 gate rows and the same rows of
// up), WG threads a workgroup, the next block's loads issued before this
// block's arithmetic. Entry e of the tables is expert experts[e]: its
// gate at slot slots[e], up at slots[8 + e], down at slots[16 + e].

struct Params {
  rows1: u32,   // phase 1: gate (and up) rows, the FFN width
  nb1: u32,     // blocks a gate row (the hidden size / 256)
  spr1: u32,
  tiles1: u32,  // phase-1 tiles an expert
  rows2: u32,   // phase 2: down rows, the hidden size
  nb2: u32,     // blocks a down row (the FFN width / 256)
  spr2: u32,
  tiles2: u32,  // phase-2 tiles an expert
  wstride: u32, // vec4s a weight slot
  k: u32,       // experts chosen (ids in sel)
  nexp: u32,    // entries in the tables (at most 8)
  xstride2: u32, // vec4s of q an expert's activation
  phase: u32,   // 0: both phases; 1 or 2: that one alone (ops.FFN.Apart)
  _p0: u32,
  _p1: u32,
  _p2: u32,
  slots: array<vec4<u32>, 6>,   // 24 entries: gate, up, down
  experts: array<vec4<u32>, 2>, // 8 entries
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> sel: array<u32>;
@group(0) @binding(4) var<storage, read_write> q: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> ctr: array<atomic<u32>, 4>;
@group(1) @binding(0) var<uniform> p: Params;

//#include quantize.inc

override ROWS: u32 = 8u;
override WG: u32 = 128u;
const HROWS: u32 = ROWS / 2u;
const RED: u32 = WG * ROWS;
// A workgroup looks at phase 1's count up to SPIN * SPIN times (2^26)
// before it gives up: ctr[3] then says so, its down rows hold garbage,
// and the model reports it (GPUModel.checkFFN). Never, unless phase 1
// cannot finish: each look waits on a round trip to the L2 (~0.2-0.5
// us), so that is some 15-30 s, where phase 1 takes tens of us.
const SPIN: u32 = 1u << 13u;

var<workgroup> red: array<f32, RED>;
var<workgroup> outv: array<f32, 256>;
var<workgroup> grab: u32;
var<workgroup> pick: u32;

fn slotOf(i: u32) -> u32 { return p.slots[i >> 2u][i & 3u]; }
fn expertOf(i: u32) -> u32 { return p.experts[i >> 2u][i & 3u]; }

// entry is the table entry of the expert at place j of the router's
// choice, or 0xffffffff if the tables do not hold it.
fn entry(j: u32) -> u32 {
  let want = sel[j];
  for (var e = 0u; e < min(p.nexp, 8u); e++) {
    if (expertOf(e) == want) { return e; }
  }
  return 0xffffffffu;
}

//#include q4k_xq.inc

// tofloat: q4k_matmul.wgsl's with CONV 1 (see there).
fn tofloat(v: vec4<u32>) -> vec4<f32> {
  return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
}

fn load_x(g: u32) -> array<vec4<u32>, 6> {
  return array<vec4<u32>, 6>(x[g], x[g + 1u], x[g + 2u], x[g + 6u], x[g + 7u], x[g + 8u]);
}

fn load_q(g: u32) -> array<vec4<u32>, 6> {
  return array<vec4<u32>, 6>(q[g], q[g + 1u], q[g + 2u], q[g + 6u], q[g + 7u], q[g + 8u]);
}

// blockSum is acc plus one block's 16 low and 16 high weights of a
// thread's ROWS rows (hs, qs) times its x groups xq.
fn blockSum(acc0: array<f32, ROWS>, hs: array<vec4<u32>, ROWS>, qs: array<vec4<u32>, ROWS>, xq: array<vec4<u32>, 6>, s: Sel) -> array<f32, ROWS> {
  var acc = acc0;
  var hv = hs; // naga indexes only variables by a loop's index
  var qv = qs;
  let ml = bitcast<vec4<f32>>(xq[2]);
  let mh = bitcast<vec4<f32>>(xq[5]) * 0.00390625;
  for (var r = 0u; r < ROWS; r++) {
    let h = hv[r];
    let qw = qv[r];
    let dm = unpack2x16float(h.x);
    let sm = pairs(h, s);
    let lo = pairsum(qw, xq[0], xq[1]);
    let hi = pairsum(qw >> vec4<u32>(4u), xq[3], xq[4]);
    acc[r] += dm.x * (sm.x * ml.x * lo + sm.y * mh.x * hi) - dm.y * (sm.z * ml.y + sm.w * mh.y);
  }
  return acc;
}

// reduce sums acc over the row group's 8 * spr threads into red.
fn reduce(acc0: array<f32, ROWS>, tid: u32, spr: u32) {
  var acc = acc0;
  let seg = 8u * spr;
  for (var i = 0u; i < ROWS; i++) {
    red[i * WG + tid] = acc[i];
  }
  for (var s = seg >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if ((tid & (seg - 1u)) < s) {
      for (var i = 0u; i < ROWS; i++) {
        red[i * WG + tid] += red[i * WG + tid + s];
      }
    }
  }
}

// glu is phase-1 tile t of the expert at place j (table entry e, or none:
// 0xffffffff): rows of silu(gate x) * (up x), quantized into q.
fn glu(j: u32, t: u32, e: u32, tid: u32) {
  if (e == 0xffffffffu) {
    return;
  }
  let spr = p.spr1;
  let nb = p.nb1;
  let c = tid & 7u;
  let slot = (tid >> 3u) & (spr - 1u);
  let grp = (tid >> 3u) / spr;
  let row0 = (t * ((WG / 8u) / spr) + grp) * HROWS;
  let wg = slotOf(e) * p.wstride;
  let wu = slotOf(8u + e) * p.wstride;
  let cj = c >> 1u;
  let half = c & 1u;
  let s = selector(cj);
  var acc: array<f32, ROWS>;
  for (var i = 0u; i < ROWS; i++) {
    acc[i] = 0.0;
  }
  var pre_xq: array<vec4<u32>, 6>;
  var pre_h: array<vec4<u32>, ROWS>;
  var pre_q: array<vec4<u32>, ROWS>;
  for (var b = slot; b < nb; b += spr) {
    let gl = (b * 16u + 4u * cj + half) * 3u;
    let bn = min(b + spr, nb - 1u);
    if (b == slot) {
      pre_xq = load_x(gl);
    }
    let xq = pre_xq;
    pre_xq = load_x((bn * 16u + 4u * cj + half) * 3u);
    var hs: array<vec4<u32>, ROWS>;
    var qs: array<vec4<u32>, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
      let up = r >= HROWS;
      let base = select(wg, wu, up);
      let row = min(row0 + select(r, r - HROWS, up), p.rows1 - 1u);
      if (b == slot) {
        let blk = base + (row * nb + b) * 9u;
        pre_h[r] = w[blk];
        pre_q[r] = w[blk + 1u + c];
      }
      hs[r] = pre_h[r];
      qs[r] = pre_q[r];
      let nblk = base + (row * nb + bn) * 9u;
      pre_h[r] = w[nblk];
      pre_q[r] = w[nblk + 1u + c];
    }
    acc = blockSum(acc, hs, qs, xq, s);
  }
  reduce(acc, tid, spr);
  if ((tid & (8u * spr - 1u)) == 0u) {
    for (var r = 0u; r < HROWS; r++) {
      let row = row0 + r;
      if (row < p.rows1) {
        let g = red[r * WG + tid];
        let u = red[(r + HROWS) * WG + tid];
        outv[grp * HROWS + r] = g / (1.0 + exp(-g)) * u;
      }
    }
  }
  workgroupBarrier();
  let nout = (WG / 8u / spr) * HROWS;
  let first = t * nout;
  if (tid < nout / 16u && first + 16u * tid < p.rows1) {
    let o = 16u * tid;
    quantize(array<vec4<f32>, 4>(vec4<f32>(outv[o], outv[o + 1u], outv[o + 2u], outv[o + 3u]),
      vec4<f32>(outv[o + 4u], outv[o + 5u], outv[o + 6u], outv[o + 7u]),
      vec4<f32>(outv[o + 8u], outv[o + 9u], outv[o + 10u], outv[o + 11u]),
      vec4<f32>(outv[o + 12u], outv[o + 13u], outv[o + 14u], outv[o + 15u])), (j * p.rows1 + first) / 16u + tid);
  }
}

// down is phase-2 tile t of the expert at place j (entry e): its down
// rows of q's activation j into y. Its first block of weights is asked
// for before it waits for phase 1.
fn down(j: u32, t: u32, e: u32, wait: bool, tid: u32) {
  let spr = p.spr2;
  let nb = p.nb2;
  let c = tid & 7u;
  let slot = (tid >> 3u) & (spr - 1u);
  let grp = (tid >> 3u) / spr;
  let row0 = (t * ((WG / 8u) / spr) + grp) * ROWS;
  let wd = slotOf(16u + (e & 7u)) * p.wstride;
  var pre_h: array<vec4<u32>, ROWS>;
  var pre_q: array<vec4<u32>, ROWS>;
  if (e != 0xffffffffu) {
    for (var r = 0u; r < ROWS; r++) {
      let blk = wd + (min(row0 + r, p.rows2 - 1u) * nb + slot) * 9u;
      pre_h[r] = w[blk];
      pre_q[r] = w[blk + 1u + c];
    }
  }
  // Phase 1's count: thread 0 spins, the barrier holds the others (naga
  // makes storageBarrier a device-scope acquire and release on Vulkan,
  // Metal and D3D; WGSL itself promises workgroup scope). Two nested
  // loops of SPIN looks each, 2^26 in all. (lavapipe never waits: it
  // runs FFN.Apart.)
  if (tid == 0u && wait) {
    var done = false;
    for (var o = 0u; o < SPIN && !done; o++) {
      for (var i = 0u; i < SPIN; i++) {
        if (atomicLoad(&ctr[1]) >= p.k * p.tiles1) {
          done = true;
          break;
        }
      }
    }
    if (!done) {
      atomicStore(&ctr[3], 1u);
    }
  }
  storageBarrier();
  if (e == 0xffffffffu) {
    return;
  }
  let cj = c >> 1u;
  let half = c & 1u;
  let s = selector(cj);
  let xbase = j * p.xstride2;
  var acc: array<f32, ROWS>;
  for (var i = 0u; i < ROWS; i++) {
    acc[i] = 0.0;
  }
  var pre_xq: array<vec4<u32>, 6>;
  for (var b = slot; b < nb; b += spr) {
    let gl = xbase + (b * 16u + 4u * cj + half) * 3u;
    let bn = min(b + spr, nb - 1u);
    if (b == slot) {
      pre_xq = load_q(gl);
    }
    let xq = pre_xq;
    pre_xq = load_q(xbase + (bn * 16u + 4u * cj + half) * 3u);
    var hs: array<vec4<u32>, ROWS>;
    var qs: array<vec4<u32>, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
      hs[r] = pre_h[r];
      qs[r] = pre_q[r];
      let nblk = wd + (min(row0 + r, p.rows2 - 1u) * nb + bn) * 9u;
      pre_h[r] = w[nblk];
      pre_q[r] = w[nblk + 1u + c];
    }
    acc = blockSum(acc, hs, qs, xq, s);
  }
  reduce(acc, tid, spr);
  if ((tid & (8u * spr - 1u)) == 0u) {
    for (var r = 0u; r < ROWS; r++) {
      let row = row0 + r;
      if (row < p.rows2) {
        y[j * p.rows2 + row] = red[r * WG + tid];
      }
    }
  }
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) tid: u32, @builtin(num_workgroups) nw: vec3<u32>) {
  let n1 = p.k * p.tiles1;
  // Phase 2 alone: its tiles from the counter's 0 on, nothing to wait for.
  let first = select(0u, n1, p.phase == 2u);
  let total = select(n1 + p.k * p.tiles2, n1, p.phase == 1u);
  loop {
    workgroupBarrier(); // red, outv and grab are free again
    if (tid == 0u) {
      grab = atomicAdd(&ctr[0], 1u) + first;
    }
    let g = workgroupUniformLoad(&grab);
    if (g >= total) {
      break;
    }
    var j = 0u;
    var t = 0u;
    if (g < n1) {
      j = g / p.tiles1;
      t = g % p.tiles1;
    } else {
      j = (g - n1) / p.tiles2;
      t = (g - n1) % p.tiles2;
    }
    if (tid == 0u) {
      pick = entry(j);
    }
    let e = workgroupUniformLoad(&pick);
    if (g < n1) {
      glu(j, t, e, tid);
      // The tile's q written, then counted (storageBarrier: a
      // device-scope release).
      storageBarrier();
      if (tid == 0u) {
        atomicAdd(&ctr[1], 1u);
      }
    } else {
      down(j, t, e, p.phase == 0u, tid);
    }
  }
  // This workgroup's counts before its leaving (a device-scope release),
  // so that the last to leave sets back counters no one adds to after.
  storageBarrier();
  if (tid == 0u) {
    let left = atomicAdd(&ctr[2], 1u) + 1u;
    if (left == nw.x * nw.y * nw.z) {
      // The last to leave: every other workgroup has taken its last tile.
      // ctr[3], the give-up flag, stays for the host to read.
      atomicStore(&ctr[0], 0u);
      atomicStore(&ctr[1], 0u);
      atomicStore(&ctr[2], 0u);
    }
  }
}
