// A kernel that is slow on purpose, for TestSubmissionOutlastsWgpuWait.
// Each invocation steps an xorshift32 generator, seeded with its index + 1,
// 8 * p.iters times (a dependent chain that no compiler can shorten) and
// XORs where it ended into out[0]. xorshift32 is linear over GF(2), so the
// sum is the n-step map applied to the XOR of all seeds: the test computes
// it exactly in microseconds. The loop runs at most 65535 times per
// invocation, the limit that llvmpipe (lavapipe) silently imposes on
// loops; the length comes from the number of workgroups instead.

struct Params {
  iters: u32,
  gx: u32, // workgroups per row of the dispatch
}

@group(0) @binding(0) var<storage, read_write> out: array<atomic<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

fn step(x: u32) -> u32 {
  var y = x ^ (x << 13u);
  y ^= y >> 17u;
  return y ^ (y << 5u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  var x = (wid.y * p.gx + wid.x) * 64u + lid + 1u;
  for (var i = 0u; i < p.iters; i++) {
    x = step(step(step(step(step(step(step(step(x))))))));
  }
  atomicXor(&out[0], x);
}
