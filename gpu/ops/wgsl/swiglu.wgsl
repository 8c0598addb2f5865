// SwiGLU: y = silu(gate) * up, elementwise over n.

struct Params {
  n: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> gate: array<f32>;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let i = (wid.x + wid.y * p.gx) * 256u + tid;
  if (i >= p.n) {
    return;
  }
  let g = gate[i];
  y[i] = g / (1.0 + exp(-g)) * up[i];
}
