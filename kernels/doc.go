// Package kernels will own WGSL kernel artifacts (source and descriptor
// blobs), device classes, the correctness gate against gpu/ref, the
// benchmark, signed endorsements, the trust policy and pulling endorsed
// kernels from the swarm. See DESIGN.md, "Kernels and evolution". Not built
// yet: this file only fixes the package's place in the layout.
package kernels
