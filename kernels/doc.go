// Package kernels owns the kernel lab's records: signed endorsements of
// kernel variants per device class (ENDORSEMENT.md), their verification,
// the trust policy that picks candidates, the registry of active kernels
// with rollback, and gossip of endorsements by device class. The
// correctness gate, the benchmark and pulling run variants on the GPU and
// are planned (DESIGN.md, "Kernels and evolution").
package kernels
