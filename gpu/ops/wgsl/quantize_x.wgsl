// Quantize x for the Q4_K products' XQ flavor (q4k_matmul.wgsl, load_xq):
// each group of 16 values becomes 16 integers in [-127, 127] and a scale
// (the group's largest magnitude / 127), written as three vec4: the
// pairs' first words, v(4k+2) + 65536 v(4k), their second words, v(4k+3)
// + 65536 v(4k+1) (two's complement, k = 0..3), and (scale, the sum of
// the group's quantized values times the scale, 0, 0). One thread a
// group. ops.QuantizeX is the same on the CPU.

struct Params {
  groups: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> q: array<vec4<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let g = (wid.x + wid.y * p.gx) * 64u + tid;
  if (g >= p.groups) {
    return;
  }
  var v = array<vec4<f32>, 4>(x[4u * g], x[4u * g + 1u], x[4u * g + 2u], x[4u * g + 3u]);
  let a = max(max(abs(v[0]), abs(v[1])), max(abs(v[2]), abs(v[3])));
  let amax = max(max(a.x, a.y), max(a.z, a.w));
  let inv = select(0.0, 127.0 / amax, amax > 0.0);
  var qs: array<vec4<i32>, 4>;
  var sum = vec4<i32>(0);
  for (var k = 0u; k < 4u; k++) {
    qs[k] = vec4<i32>(clamp(round(v[k] * inv), vec4<f32>(-127.0), vec4<f32>(127.0)));
    sum += qs[k];
  }
  // Word k: values 4k..4k+3 are qs[k].xyzw.
  let first = vec4<i32>(qs[0].z, qs[1].z, qs[2].z, qs[3].z) + vec4<i32>(qs[0].x, qs[1].x, qs[2].x, qs[3].x) * 65536;
  let second = vec4<i32>(qs[0].w, qs[1].w, qs[2].w, qs[3].w) + vec4<i32>(qs[0].y, qs[1].y, qs[2].y, qs[3].y) * 65536;
  let scale = amax / 127.0;
  q[3u * g] = bitcast<vec4<u32>>(first);
  q[3u * g + 1u] = bitcast<vec4<u32>>(second);
  q[3u * g + 2u] = vec4<u32>(bitcast<u32>(scale), bitcast<u32>(scale * f32(sum.x + sum.y + sum.z + sum.w)), 0u, 0u);
}
