// Copy n16 16-byte units from src to dst: the shader-side copy bandwidth
// that the benchmarks divide kernel bandwidth by (next to the copy engine's
// CopyBufferToBuffer). Each thread moves UNROLL units, a workgroup's
// accesses contiguous.

struct Params {
  n16: u32,
  gx: u32,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(1) @binding(0) var<uniform> p: Params;

override UNROLL: u32 = 4u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
  let base = (wid.x + wid.y * p.gx) * 256u * UNROLL + tid;
  for (var i = 0u; i < UNROLL; i++) {
    let j = base + i * 256u;
    if (j < p.n16) {
      dst[j] = src[j];
    }
  }
}
