// Package lab runs kernel variants on the GPU for the kernel lab: the
// correctness gate (kernels.Gate) and the benchmark (kernels.Bench) over
// the gpu runtime, in this process (Lab) or, for WGSL from anyone else, in
// a child process per call (Isolated, ServeWorker) so that a kernel that
// hangs or loses the device cannot take the caller with it; and Activate,
// which makes a device run the registry's active variants.
//
// It owns each op's test harness (inputs and reference check; the
// dispatch rule is the op library's, gpu/ops) for the ops it has wired
// (Ops). It does not decide what to trust or activate: kernels (the
// Puller, the endorsing rule) does.
package lab
