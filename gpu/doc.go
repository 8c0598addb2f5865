// Package gpu is the GPU runtime of rdrr peer: a headless WebGPU device
// (github.com/cogentcore/webgpu, which links wgpu-native) on Vulkan, Metal,
// DX12 or GL, with
//
//   - device selection and adapter listing (Open, ListAdapters, Info,
//     Limits), asking for the WebGPU default limits plus the buffer and
//     binding sizes the workload needs;
//   - buffers from a size-class pool (Alloc, Buffer.Release), byte ranges
//     of them (Span, Region, SpanOf);
//   - the paging hot path Upload, through a ring of persistently mapped
//     staging buffers filled by several goroutines; Write
//     (queue.WriteBuffer) for small data; Read for readback;
//   - a pipeline cache keyed by the WGSL's hash and constants (Compile,
//     Kernel: the descriptor the kernel lab feeds with third-party WGSL);
//   - command batches (Batch): many dispatches and copies, one submit,
//     bind groups reused across batches, scratch buffers for an op's
//     partial results (Batch.Scratch);
//   - variants (Variant, Device.UseVariant): other WGSL with a kernel's
//     ABI that the device compiles wherever that kernel is asked for, such
//     as a kernel variant the kernel lab activated. A variant is data; the
//     runtime does not know what the kernel computes.
//
// The op library is gpu/ops: each built-in kernel's WGSL, its shape
// struct, its dispatch rule (shape to grid, uniform block, constants and
// binding sizes) and the Kernels that record them into a Batch. The
// enumerations the kernels and their references share (element types,
// RoPE styles, routing modes) are gpu/abi; the float64 references of
// every kernel, and the tolerances they are checked to, are gpu/ref; the
// GGML Q4_K codec is gpu/q4k. Those three are pure Go, for the model
// generator and the kernel lab's correctness gate.
//
// Errors: compile errors, shape errors and device loss come back as
// *KernelError values naming the kernel and wrapping ErrCompile, ErrShape,
// ErrDeviceLost and the other sentinels of errors.go. After ErrDeviceLost
// the Device is unusable; Close it and Open another (the process keeps
// running).
//
// The package works around three defects of the binding (see native.go
// and shim.c): asynchronous callbacks receive the address of a Go variable
// that the garbage collector may free first (the process then crashes), an
// instance descriptor with uninitialized native fields, and error scopes
// that never capture out-of-memory errors, which wgpu-native turns into an
// abort. wgpu-native also aborts on any invalid queue submission, so Batch
// checks buffer and pipeline lifetimes before it submits; and its blocking
// poll gives up after 5 s and then frees what the GPU may still be running
// (gfx-rs/wgpu#3601), so the device's poller never blocks in wgpu and Close
// waits for the queue without a deadline (device.go).
//
// The package owns no kernels, no model logic, no tiers and no kernel
// search: those are gpu/ops, experts/, tiers/ and kernels/, which build on
// it. It imports nothing else from this repository. Its tests load the
// GPU with gpu/ops's kernels through link_test.go (an external test
// package, since gpu/ops imports gpu).
package gpu
