// Appends one position to a KV cache: k and v rows of n floats, read from
// src at k_off and v_off, written to kc and vc at row pos. The cache
// buffers are bound whole and the position is a parameter, so the bind
// group is the same at every position.

struct Params {
  n: u32,
  k_off: u32,
  v_off: u32,
  pos: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> kc: array<f32>;
@group(0) @binding(2) var<storage, read_write> vc: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x;
  if (i < p.n) {
    kc[p.pos * p.n + i] = src[p.k_off + i];
    vc[p.pos * p.n + i] = src[p.v_off + i];
  }
}
