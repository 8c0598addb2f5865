// Fused Q4_K matrix-vector (TOK = 1) or small-batch matrix product:
// y[t][r] = sum_k W[r][k] * x[t][k] with W in GGML block_q4_K rows.
//
// Layout of the work: 8 threads share a block (thread c reads the 16 quant
// bytes 16c..16c+15: sub-blocks 2(c/2) and 2(c/2)+1, weights 16(c%2)..+15 of
// each), SPR block slots make a row group that strides over the row's
// blocks, and each thread of a row group handles ROWS rows with the same x
// (x is read once per ROWS rows). A workgroup of WG threads holds
// WG/8/SPR row groups. Partial sums meet in a tree over the row group's
// 8*SPR threads. The Go side (DefaultQ4KConfig) picks the constants per
// shape; on an H100 few slots and 8 rows per thread won, because each
// thread then keeps many independent loads in flight.
//
// Constants: ROWS rows per thread; TOK tokens per workgroup (1: the
// matrix-vector path); WG threads per workgroup; PIPE 1 issues the next
// block's loads before this block's arithmetic; POS 1 decodes nibbles with
// the positional trick (see quad; lows, highs and pairs on the matrix-
// vector path), 0 with shifts; CONV 1 converts small
// integers to float with the 2^23 trick, 0 with conversion instructions.
// GROUPED 1 makes one dispatch run up to 16 independent matrix-vector
// products (workgroup z = product e): W of product e starts at vec4
// slots[e] * wstride of w (an arena of equal slots, as the expert cache
// keeps), its x at vec4 e * xstride of x (0: all share one x), its y at
// e * rows of y. The fixed cost of a dispatch (launch, ramp-up, tail)
// is then paid once for all of an MoE layer's expert products.
//
// The masked flavor (kernel q4k_matmul_masked; lines marked //+MASKED are
// its own, lines marked //-MASKED the plain kernel's) runs an MoE layer
// whose experts are all resident without the host knowing which ones the
// router chose: product e is expert experts[e], and runs only if that
// expert is among the router's k ids in sel, at position j; it then reads
// x at j * xstride and writes y at j * rows (plus yupper if bit 31 of its
// experts entry is set: an expert's up matrix in the same dispatch as its
// gate, each into its half of y). Products of experts not chosen return at
// once. The choice stays on the GPU: no read-back between the
// router and the experts.
//
// The GLU flavors (q4k_matmul_glu, grouped; q4k_matmul_masked_glu and
// q4k_matmul_masked_part_glu; matrix-vector) run an expert's gate and up
// matrices in the same workgroup, row for row, and write silu(gate) * up:
// product e is expert e (grouped) or experts[e] (masked) with its gate at
// slot slots[e] and its up at slots[e + 8] (at most 8 experts a
// dispatch), each thread's ROWS (even) rows the first half gate rows and
// the second half the same rows of up, and y gets rows outputs at e *
// rows (grouped) or j * rows (masked). The SwiGLU dispatch between the
// gate and up products and the down products is gone. Kernels of their
// own: a variant of q4k_matmul written before them has no GLU.
//
// The PART flavors (q4k_matmul_part, q4k_matmul_masked_part; lines
// marked //+PART) are products of an RMSNorm's output without its
// dispatch: x holds x * g (the norm's weight) and part nparts partial sums
// of x^2, both written by the dispatch that wrote x (accumulate's NORM);
// the product is W (x * g), each row then scaled by 1 / sqrt(sum(part) /
// cols + eps). Matrix-vector only.
//
// The QOUT flavors (q4k_matmul_glu_xq_yq, q4k_matmul_masked_glu_xq_yq)
// also write the GLU output quantized (quantize_x.wgsl's form) into q:
// the down products' x with no quantize dispatch between.

struct Params {
  rows: u32,     // output rows
  nb: u32,       // blocks per row (cols / 256)
  spr: u32,      // block slots per row group (power of two, <= 32)
  n: u32,        // tokens
  gx: u32,       // workgroups along x (2-D grids for many rows)
  wstride: u32,  // GROUPED: vec4s per weight slot
  xstride: u32,  // GROUPED: vec4s between products' x (0: shared x)
  k: u32,        // MASKED: ids in sel
  slots: array<vec4<u32>, 4>, // GROUPED: weight slot of product e, 4 per vec4
//+MASKED  experts: array<vec4<u32>, 4>, // expert of product e (bit 31: output to the upper half)
//+MASKED  yupper: u32,  // where the upper half of y starts (floats)
//+MASKED  xupper: u32,  // SWIGLU: where the up half of x starts (vec4s)
//+MASKED  _p2: u32,
//+MASKED  _p3: u32,
//+PART  eps: f32,
//+PART  nparts: u32,
//+PART  _n2: u32,
//+PART  _n3: u32,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
//-XQ @group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
//+XQ @group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;
//+MASKED @group(0) @binding(3) var<storage, read> sel: array<u32>;
//+PART //-MASKED @group(0) @binding(3) var<storage, read> part: array<f32>;
//+PART //+MASKED @group(0) @binding(4) var<storage, read> part: array<f32>;
//+QOUT //-MASKED @group(0) @binding(3) var<storage, read_write> q: array<vec4<u32>>;
//+QOUT //+MASKED @group(0) @binding(4) var<storage, read_write> q: array<vec4<u32>>;
//+QOUT //#include quantize.inc
//+QOUT var<workgroup> outv: array<f32, 256>; // the workgroup's output rows (GLU: at most 16 * 256 / 8 / 2)

// xr is vec4 i of x as floats, xu as words: each flavor's x is read
// through them, so that the code of the other flavor's path still
// type-checks (WGSL compiles branches that a constant turns off).
//-XQ const XQ: u32 = 0u;
//+XQ const XQ: u32 = 1u;
//-XQ fn xr(i: u32) -> vec4<f32> { return x[i]; }
//+XQ fn xr(i: u32) -> vec4<f32> { return bitcast<vec4<f32>>(x[i]); }
//-XQ fn xu(i: u32) -> vec4<u32> { return bitcast<vec4<u32>>(x[i]); }
//+XQ fn xu(i: u32) -> vec4<u32> { return x[i]; }

// rms is what a row's sum is scaled by: 1 without PART.
//-PART fn rms() -> f32 { return 1.0; }
//+PART fn rms() -> f32 {
//+PART   var ssq = 0.0;
//+PART   for (var i = 0u; i < min(p.nparts, 64u); i++) { // 64: ops.MaxParts
//+PART     ssq += part[i];
//+PART   }
//+PART   return inverseSqrt(ssq / f32(p.nb * 256u) + p.eps);
//+PART }

// chosen is where product e's expert is among the router's ids, or
// 0xffffffff (MASKED); the plain kernel's products are all chosen, at e.
//-MASKED fn chosen(e: u32) -> u32 { return e; }
//-MASKED fn upper(e: u32) -> u32 { return 0u; }
//+MASKED fn upper(e: u32) -> u32 { return select(0u, p.yupper, (p.experts[e >> 2u][e & 3u] >> 31u) == 1u); }
//+MASKED fn chosen(e: u32) -> u32 {
//+MASKED   let want = p.experts[e >> 2u][e & 3u] & 0x7fffffffu;
//+MASKED   for (var i = 0u; i < min(p.k, 32u); i++) {
//+MASKED     if (sel[i] == want) { return i; }
//+MASKED   }
//+MASKED   return 0xffffffffu;
//+MASKED }
var<workgroup> pick: u32;

override ROWS: u32 = 2u;
override TOK: u32 = 1u;
override CONV: u32 = 1u;
override PIPE: u32 = 0u;
override POS: u32 = 1u; // positional nibble trick (see quad)
override WG: u32 = 256u; // threads per workgroup (64, 128 or 256)
override GROUPED: u32 = 0u;
// ACC 1 adds the product to y (y += W x: a residual connection) instead of
// storing it. SWIGLU 1 (masked flavor, matrix-vector) reads x as
// silu(gate) * up, gate at x's usual place and up xupper vec4s further: the
// down projection of an MoE expert straight from its gate and up products.
override ACC: u32 = 0u;
override SWIGLU: u32 = 0u;
//-GLU const GLU: u32 = 0u;
//+GLU const GLU: u32 = 1u;
const HROWS: u32 = (ROWS + 1u) / 2u; // GLU: gate rows (and up rows) per thread (ROWS is even there)

// blkAt is the vec4 index of row r's block b of a thread's rows from
// row0: with GLU, rows HROWS.. are the up matrix's (at wu) rows r -
// HROWS; otherwise every row is the matrix at wb's.
fn blkAt(wb: u32, wu: u32, row0: u32, r: u32, b: u32) -> u32 {
  let up = GLU == 1u && r >= HROWS;
  let rr = select(r, r - HROWS, up);
  return select(wb, wu, up) + (min(row0 + rr, p.rows - 1u) * p.nb + b) * 9u;
}

const RT: u32 = ROWS * TOK; // accumulators per thread
const RED: u32 = WG * RT;
var<workgroup> red: array<f32, RED>;

//#include q4k_xq.inc

// scales returns (sc0, sc1, m0, m1) of sub-blocks 2j and 2j+1 as floats.
fn scales(h: vec4<u32>, s: Sel) -> vec4<f32> {
  let a_sc = select(h.w, h.y, s.lo);
  let a_m = select(h.w, h.z, s.lo);
  let sc0 = ((a_sc >> s.s_sc) & s.mask) | ((h.y >> s.s_hi) & s.m_hi);
  let sc1 = ((a_sc >> (s.s_sc + 8u)) & s.mask) | ((h.y >> (s.s_hi + 8u)) & s.m_hi);
  let m0 = ((a_m >> s.s_m) & s.mask) | ((h.z >> s.s_hi) & s.m_hi);
  let m1 = ((a_m >> (s.s_m + 8u)) & s.mask) | ((h.z >> (s.s_hi + 8u)) & s.m_hi);
  return tofloat(vec4<u32>(sc0, sc1, m0, m1));
}


// tofloat converts small integers (< 2^23) to f32 exactly. CONV 1 uses
// f32(2^23 + v) - 2^23 (an OR and an add, full-rate ALU) instead of
// integer-to-float conversions, which issue at a quarter rate or less on
// NVIDIA GPUs.
fn tofloat(v: vec4<u32>) -> vec4<f32> {
  if (CONV == 1u) {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
  }
  return vec4<f32>(v);
}

// quad returns the four low nibbles of the bytes of w, each scaled by the
// power of two its position implies: (q0, 256 q1, 65536 q2, 65536 q3).
// The x values they multiply are pre-scaled by (1, 2^-8, 2^-16, 2^-16), so
// each product equals q*x exactly (powers of two scale exactly) while the
// nibbles need no shifts.
fn quad(w: u32) -> vec4<f32> {
  if (POS == 0u) {
    // Plain nibbles (no positional scaling; x is used unscaled).
    let u = vec4<u32>(w, w >> 8u, w >> 16u, w >> 24u) & vec4<u32>(0xfu);
    if (CONV == 1u) {
      return bitcast<vec4<f32>>(u | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
    }
    return vec4<f32>(u);
  }
  let v = vec4<u32>(w, w, w, w >> 8u) & vec4<u32>(0xfu, 0xf00u, 0xf0000u, 0xf0000u);
  if (CONV == 1u) {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - vec4<f32>(8388608.0);
  }
  return vec4<f32>(v);
}

// lows and highs are quad for the matrix-vector path, the low and the
// high nibbles of w's four bytes with one shift for both (s = w >> 12):
// no nibble then sits at or above bit 23, where the 2^23 trick of
// tofloat ends. Their positional scales are XL and XH. With pairs for
// the scales, this path takes about 9 integer instructions every 8
// weights instead of 11, and the scales 14 instead of ~22 a block and
// row: on an H100, whose SMs issue integer instructions at half their
// FP32 rate, that is what the products' arithmetic waits for (2.6-5.7%
// faster products, gpu/BENCHMARKS.md).
fn lows(w: u32, s: u32) -> vec4<f32> {
  return tofloat(vec4<u32>(w, w, w, s) & vec4<u32>(0xfu, 0xf00u, 0xf0000u, 0xf000u));
}

fn highs(w: u32, s: u32) -> vec4<f32> {
  return tofloat(vec4<u32>(w, w, s, s) & vec4<u32>(0xf0u, 0xf000u, 0xf00u, 0xf0000u));
}

const XL: vec4<f32> = vec4<f32>(1.0, 0.00390625, 0.0000152587890625, 0.000244140625);
// XH also carries pairs' 2^-8 for sc1.
const XH: vec4<f32> = vec4<f32>(0.000244140625, 0.00000095367431640625, 0.0000152587890625, 0.000000059604644775390625);

// load_x returns the 32 x values of a thread's quant bytes: 4 vec4 from
// o (low nibbles) and 4 from o + 8 (high nibbles, 32 weights later).
//-MASKED fn xupper() -> u32 { return 0u; }
//+MASKED fn xupper() -> u32 { return p.xupper; }

// xv is vec4 i of x (SWIGLU: silu of the gate times the up).
fn xv(i: u32) -> vec4<f32> {
  if (SWIGLU == 1u) {
    let g = xr(i);
    return g / (vec4<f32>(1.0) + exp(-g)) * xr(i + xupper());
  }
  return xr(i);
}

fn load_x(o: u32) -> array<vec4<f32>, 8> {
  return array<vec4<f32>, 8>(xv(o), xv(o + 1u), xv(o + 2u), xv(o + 3u), xv(o + 8u), xv(o + 9u), xv(o + 10u), xv(o + 11u));
}

// load_xq returns a thread's quantized x (XQ) from vec4 g of x on: its
// low group (16 values: g the pairs' first words, g + 1 their second,
// g + 2 the scale and the sum) and its high group, 32 values later (g +
// 6). quantize_x.wgsl writes them: a group's values v0..v15 are integers
// in [-127, 127] times its scale, and word k of the first vec4 holds
// v(4k+2) + 65536 v(4k), of the second v(4k+3) + 65536 v(4k+1) (two's
// complement). A quant word masked to the low nibbles of its bytes 0 and
// 2, q0 + 65536 q2, times the first: q0 v(4k+2) + 65536 (q0 v(4k) + q2
// v(4k+2)), modulo 2^32. The upper half holds two products' sum.
fn load_xq(g: u32) -> array<vec4<u32>, 6> {
  return array<vec4<u32>, 6>(xu(g), xu(g + 1u), xu(g + 2u), xu(g + 6u), xu(g + 7u), xu(g + 8u));
}


// With POS 0 the scale is 1: f32(POS) picks 2^-8k or 1 per lane.
const XS: vec4<f32> = vec4<f32>(1.0, 1.0 - f32(POS) * 0.99609375, 1.0 - f32(POS) * 0.9999847412109375, 1.0 - f32(POS) * 0.9999847412109375);

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let wg = wid.x + wid.y * p.gx;
  let c = tid & 7u;
  let slot = (tid >> 3u) & (p.spr - 1u);
  let grp = (tid >> 3u) / p.spr;
  let row0 = (wg * ((WG / 8u) / p.spr) + grp) * select(ROWS, HROWS, GLU == 1u);
  let grouped = GROUPED == 1u;
  let e = select(0u, wid.z, grouped);            // product (GROUPED)
  let tok0 = select(wid.z * TOK, 0u, grouped);
  let wbase = select(0u, p.slots[e >> 2u][e & 3u] * p.wstride, grouped);
  let ue = (e + 8u) & 15u; // GLU: the up matrix's slot
  let wup = select(wbase, p.slots[ue >> 2u][ue & 3u] * p.wstride, GLU == 1u && grouped);
  if (tid == 0u) {
    pick = chosen(e);
  }
  let at = workgroupUniformLoad(&pick); // where product e's output goes
  if (at == 0xffffffffu) {
    return; // MASKED: the router did not choose this expert
  }
  let xbase = select(0u, at * p.xstride, grouped);
  let ybase = select(0u, upper(e) + at * p.rows, grouped);
  let j = c >> 1u;          // quant byte group: sub-blocks 2j (low), 2j+1 (high)
  let half = c & 1u;
  let sel = selector(j);
  let cols4 = p.nb * 64u;   // x stride per token in vec4

  var acc: array<f32, RT>;
  for (var i = 0u; i < RT; i++) {
    acc[i] = 0.0;
  }
  var pre_x: array<vec4<f32>, 8>;
  var pre_xq: array<vec4<u32>, 6>;
  var pre_h: array<vec4<u32>, ROWS>;
  var pre_q: array<vec4<u32>, ROWS>;

  for (var b = slot; b < p.nb; b += p.spr) {
    let xb = xbase + b * 64u + j * 16u + half * 4u; // this thread's first low x (vec4)
    let gl = xbase + (b * 16u + 4u * j + half) * 3u; // XQ: its low group (vec4)
    let bn = min(b + p.spr, p.nb - 1u);              // the next block (PIPE)
    // Matrix-vector: x's values for the block (quantized with XQ) and the
    // block's header and quant words of ROWS rows, loaded once and reused
    // for ROWS rows. With PIPE the next block's loads are issued before
    // this block's arithmetic (software pipelining: more bytes in flight
    // per thread).
    var xq: array<vec4<u32>, 6>;
    var xs: array<vec4<f32>, 8>;
    if (XQ == 1u) {
      if (PIPE == 1u) {
        if (b == slot) {
          pre_xq = load_xq(gl);
        }
        xq = pre_xq;
        pre_xq = load_xq(xbase + (bn * 16u + 4u * j + half) * 3u);
      } else {
        xq = load_xq(gl);
      }
    } else if (TOK == 1u) {
      if (PIPE == 1u) {
        if (b == slot) {
          pre_x = load_x(xb);
        }
        xs = pre_x;
        pre_x = load_x(xbase + bn * 64u + j * 16u + half * 4u);
      } else {
        xs = load_x(xb);
      }
    }
    var hs: array<vec4<u32>, ROWS>;
    var qs: array<vec4<u32>, ROWS>;
    if (TOK == 1u) {
      for (var r = 0u; r < ROWS; r++) {
        if (PIPE == 1u) {
          if (b == slot) {
            let blk = blkAt(wbase, wup, row0, r, b);
            pre_h[r] = w[blk];
            pre_q[r] = w[blk + 1u + c];
          }
          hs[r] = pre_h[r];
          qs[r] = pre_q[r];
          let nblk = blkAt(wbase, wup, row0, r, bn);
          pre_h[r] = w[nblk];
          pre_q[r] = w[nblk + 1u + c];
        } else {
          let blk = blkAt(wbase, wup, row0, r, b);
          hs[r] = w[blk];
          qs[r] = w[blk + 1u + c];
        }
      }
    }
    if (XQ == 1u) {
      // Quantized x (matrix-vector only; see load_xq): the thread's 16
      // low and 16 high weights of each row in 16 integer multiply-adds.
      // Each group's scale and the sum of its values; pairs' 256 sc1
      // and 256 m1 take the high group's 2^-8.
      let ml = bitcast<vec4<f32>>(xq[2]);
      let mh = bitcast<vec4<f32>>(xq[5]) * 0.00390625;
      for (var r = 0u; r < ROWS; r++) {
        let h = hs[r];
        let q = qs[r];
        let dm = unpack2x16float(h.x);
        let sm = pairs(h, sel);
        let lo = pairsum(q, xq[0], xq[1]);
        let hi = pairsum(q >> vec4<u32>(4u), xq[3], xq[4]);
        acc[r] += dm.x * (sm.x * ml.x * lo + sm.y * mh.x * hi) - dm.y * (sm.z * ml.y + sm.w * mh.y);
      }
    } else if (TOK == 1u) {
      let sv = xs[0] + xs[1] + xs[2] + xs[3];
      let hv = xs[4] + xs[5] + xs[6] + xs[7];
      let xsum = vec2<f32>(sv.x + sv.y + sv.z + sv.w, hv.x + hv.y + hv.z + hv.w);
      // POS 1: x scaled for lows', highs' and pairs' positions; 0: as is.
      let xl = select(vec4<f32>(1.0), XL, POS == 1u);
      let xh = select(vec4<f32>(1.0), XH, POS == 1u);
      let a0 = xs[0] * xl;
      let a1 = xs[1] * xl;
      let a2 = xs[2] * xl;
      let a3 = xs[3] * xl;
      let b0 = xs[4] * xh;
      let b1 = xs[5] * xh;
      let b2 = xs[6] * xh;
      let b3 = xs[7] * xh;
      let xsum2 = xsum * select(vec2<f32>(1.0), vec2<f32>(1.0, 0.00390625), POS == 1u); // pairs' m1 comes as 256 m1
      for (var r = 0u; r < ROWS; r++) {
        let h = hs[r];
        let q = qs[r];
        let dm = unpack2x16float(h.x);
        var sm: vec4<f32>;
        var dl: f32;
        var dh: f32;
        if (POS == 1u) {
          sm = pairs(h, sel);
          let s = q >> vec4<u32>(12u);
          dl = dot(lows(q.x, s.x), a0) + dot(lows(q.y, s.y), a1) + dot(lows(q.z, s.z), a2) + dot(lows(q.w, s.w), a3);
          dh = dot(highs(q.x, s.x), b0) + dot(highs(q.y, s.y), b1) + dot(highs(q.z, s.z), b2) + dot(highs(q.w, s.w), b3);
        } else {
          sm = scales(h, sel);
          dl = dot(quad(q.x), a0) + dot(quad(q.y), a1) + dot(quad(q.z), a2) + dot(quad(q.w), a3);
          dh = dot(quad(q.x >> 4u), b0) + dot(quad(q.y >> 4u), b1) + dot(quad(q.z >> 4u), b2) + dot(quad(q.w >> 4u), b3);
        }
        acc[r] += dm.x * (sm.x * dl + sm.y * dh) - dm.y * dot(sm.zw, xsum2);
      }
    } else {
      // Small batch: dequantize factors once per row, stream each token's x.
      for (var r = 0u; r < ROWS; r++) {
        let row = min(row0 + r, p.rows - 1u);
        let blk = (row * p.nb + b) * 9u;
        let h = w[blk];
        let q = w[blk + 1u + c];
        let dm = unpack2x16float(h.x);
        let sm = scales(h, sel);
        let l0 = quad(q.x);
        let l1 = quad(q.y);
        let l2 = quad(q.z);
        let l3 = quad(q.w);
        let h0 = quad(q.x >> 4u);
        let h1 = quad(q.y >> 4u);
        let h2 = quad(q.z >> 4u);
        let h3 = quad(q.w >> 4u);
        for (var t = 0u; t < TOK; t++) {
          let o = min(tok0 + t, p.n - 1u) * cols4 + xb;
          let a0 = xr(o);
          let a1 = xr(o + 1u);
          let a2 = xr(o + 2u);
          let a3 = xr(o + 3u);
          let b0 = xr(o + 8u);
          let b1 = xr(o + 9u);
          let b2 = xr(o + 10u);
          let b3 = xr(o + 11u);
          let sv = a0 + a1 + a2 + a3;
          let hv = b0 + b1 + b2 + b3;
          let dl = dot(l0, a0 * XS) + dot(l1, a1 * XS) + dot(l2, a2 * XS) + dot(l3, a3 * XS);
          let dh = dot(h0, b0 * XS) + dot(h1, b1 * XS) + dot(h2, b2 * XS) + dot(h3, b3 * XS);
          let xsum = vec2<f32>(sv.x + sv.y + sv.z + sv.w, hv.x + hv.y + hv.z + hv.w);
          acc[r * TOK + t] += dm.x * (sm.x * dl + sm.y * dh) - dm.y * dot(sm.zw, xsum);
        }
      }
    }
  }

  // Reduce over the row group's 8 * spr threads.
  let seg = 8u * p.spr;
  for (var i = 0u; i < RT; i++) {
    red[i * WG + tid] = acc[i];
  }
  for (var s = seg >> 1u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if ((tid & (seg - 1u)) < s) {
      for (var i = 0u; i < RT; i++) {
        red[i * WG + tid] += red[i * WG + tid + s];
      }
    }
  }
  if (GLU == 1u && (tid & (seg - 1u)) == 0u) {
    let rs = rms();
    for (var r = 0u; r < HROWS; r++) {
      let row = row0 + r;
      if (row < p.rows) {
        let g = red[r * WG + tid] * rs;
        let u = red[(r + HROWS) * WG + tid] * rs;
        y[ybase + row] = g / (1.0 + exp(-g)) * u;
//+QOUT        outv[grp * HROWS + r] = g / (1.0 + exp(-g)) * u;
      }
    }
  } else if ((tid & (seg - 1u)) == 0u) {
    let rs = rms();
    for (var r = 0u; r < ROWS; r++) {
      let row = row0 + r;
      for (var t = 0u; t < TOK; t++) {
        let tt = tok0 + t;
        if (row < p.rows && tt < p.n) {
          let v = red[(r * TOK + t) * WG + tid] * rs;
          if (ACC == 1u) {
            y[ybase + tt * p.rows + row] += v;
          } else {
            y[ybase + tt * p.rows + row] = v;
          }
        }
      }
    }
  }
//+QOUT  // QOUT (GLU, one token): the workgroup's output rows quantized too,
//+QOUT  // as quantize_x.wgsl would (the down products' x), a thread a group
//+QOUT  // of 16 rows; the Go side sees that a workgroup's rows are whole
//+QOUT  // groups (rows a multiple of 16, rows a workgroup too).
//+QOUT  workgroupBarrier();
//+QOUT  let nout = (WG / 8u / p.spr) * HROWS;
//+QOUT  let first = wg * nout;
//+QOUT  if (tid < nout / 16u && first + 16u * tid < p.rows) {
//+QOUT    let o = 16u * tid;
//+QOUT    quantize(array<vec4<f32>, 4>(vec4<f32>(outv[o], outv[o + 1u], outv[o + 2u], outv[o + 3u]),
//+QOUT      vec4<f32>(outv[o + 4u], outv[o + 5u], outv[o + 6u], outv[o + 7u]),
//+QOUT      vec4<f32>(outv[o + 8u], outv[o + 9u], outv[o + 10u], outv[o + 11u]),
//+QOUT      vec4<f32>(outv[o + 12u], outv[o + 13u], outv[o + 14u], outv[o + 15u])), (ybase + first) / 16u + tid);
//+QOUT  }
}
