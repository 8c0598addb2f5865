// Package ops is the op library of rdrr peer's GPU runtime: the built-in
// kernels and how they are run. For each op it holds
//
//   - the WGSL, in wgsl/ (embedded; one file can hold flavors that differ
//     in a binding or a field: //+NAME lines are kept only in flavors
//     with NAME, //-NAME only in those without, and markers stack), and
//     its ABI (Builtin,
//     BuiltinNames): the descriptor the runtime compiles, the kernel lab
//     measures variants against and a gpu.Variant stands in for;
//   - its shape struct (MatShape, Group, Masked, NormShape, RopeShape,
//     AttnShape, RouteShape, ...);
//   - its dispatch rule, a pure function from shape to Launch: the kernel,
//     its override constants, the grid, the uniform block and the bytes
//     each binding must hold (Q4KLaunch, RMSNormLaunch, ...). Kernels
//     records Launches with the caller's buffers; the kernel lab
//     (kernels/lab) runs the same Launches around a variant, so the rule
//     has one definition;
//   - Kernels, whose methods check the buffers against the rule, compile
//     the kernel on first use and record the dispatch: Q4_K dequantization
//     and fused Q4_K matrix-vector and small-batch products (single, in a
//     group of matrices, masked by the router's choice on the GPU, an
//     expert's gate and up together writing SwiGLU's output), f16/f32
//     products, RMSNorm, RoPE, decode attention (split over positions, then
//     merged), softmax, top-k routing, SwiGLU, weighted accumulate,
//     embedding lookup, the decode step's KV store, argmax and top-p
//     sampling, and an RMSNorm handed from the accumulate that writes its
//     input to the products that read it (AccumulateNorm, Normed and the
//     *Normed products); SelfTest checks a device with them.
//
// Each op's float64 reference, and the tolerance it is checked to, is in
// gpu/ref; the enumerations the kernels, this package and the references
// share are gpu/abi. The differential tests here run every kernel against
// its reference on random and awkward shapes. The runtime (devices,
// buffers, batches, the pipeline cache, uploads, variants) is gpu, which
// knows nothing of these kernels.
package ops
