// L2 prefetch: read a region once, a word of every 32-byte sector, so
// that a dispatch after this one finds the region in the GPU's L2 cache.
// Recorded beside a dispatch that leaves most of the GPU idle (a
// one-workgroup norm), with which it runs at once: it binds nothing that
// dispatch writes, so no barrier sits between them.
// A thread whose words xor to the key writes it to the sink (rarely, and
// harmlessly: the sink is this dispatch's alone), so that no compiler can
// drop the loads as dead.

struct Params {
  n: u32,     // words of the region
  per: u32,   // sectors a thread reads at most (a multiple of 8)
  key: u32,   // l2PrefetchKey
  _p0: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read_write> sink: array<u32>;
@group(1) @binding(0) var<uniform> p: Params;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let threads = nw.x * 256u;
  let t = wid.x * 256u + tid;
  var acc = 0u;
  // Rounds of eight loads, all asked for before any is used (a region of
  // up to 2 MB is one sector a thread: one load of a round's eight).
  for (var i = 0u; i < p.per; i += 8u) {
    var v: array<u32, 8>;
    for (var u = 0u; u < 8u; u++) {
      let j = ((i + u) * threads + t) * 8u;
      v[u] = 0u; // every round: the bundled naga initializes a loop's var once (DESIGN.md)
      if (j < p.n) {
        v[u] = w[j];
      }
    }
    for (var u = 0u; u < 8u; u++) {
      acc ^= v[u];
    }
  }
  if (acc == p.key) {
    sink[0] = acc;
  }
}
