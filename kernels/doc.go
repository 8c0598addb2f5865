// Package kernels owns the kernel lab's data and rules: kernel variants as
// content (a WGSL blob and a descriptor blob, ARTIFACTS.md) with the
// built-in kernels of gpu/ as the baselines; device classes and shape
// buckets; signed endorsements of variants per device class
// (ENDORSEMENT.md), their verification, and the trust policy that picks
// candidates; the registry of active kernels with rollback; gossip of
// endorsements by device class over an interface (an in-process network
// for tests); and Puller, which takes candidates through the correctness
// gate and the benchmark before it activates one.
//
// It does not run kernels: the Gate and Bench interfaces (gate.go) are
// implemented with the gpu runtime in kernels/lab. It does not carry
// bytes between peers either: Gossip and Fetcher are implemented by the
// swarm.
package kernels
