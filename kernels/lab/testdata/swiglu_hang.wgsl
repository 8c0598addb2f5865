// Cheater (test): never finishes on a GPU (a loop whose exit the inputs never
// take). lavapipe (gallivm) ends an invocation's loops after 65535
// iterations in all and drops what the invocation would have written, so
// there it is caught as wrong; swiglu_slow.wgsl is lavapipe's time-limit
// case.

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
  var acc = 0.0;
  loop {
    if (p.n == 0xffffffffu) {
      break;
    }
    for (var k = 0u; k < 4u; k++) {
      acc = exp(-abs(acc)) + exp(-abs(acc + 1.0)) + exp(-abs(acc + 2.0)) + exp(-abs(acc + 3.0));
      acc = exp(-abs(acc)) + exp(-abs(acc + 1.0)) + exp(-abs(acc + 2.0)) + exp(-abs(acc + 3.0));
    }
  }
  if (i >= p.n) {
    return;
  }
  let g = gate[i];
  y[i] = select(g / (1.0 + exp(-g)) * up[i], 0.0, acc == 12345.5);
}
