package ops

import (
	"context"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"sync"

	"github.com/rdrr/peer/gpu"
)

// A Launch is one dispatch of a built-in kernel as its op's dispatch rule
// computes it from a shape: which kernel, with which override constants,
// over which grid, with which uniform block, and what each storage
// binding must hold. The rules (RMSNormLaunch, Q4KLaunch, ...) are pure:
// Kernels records their Launch with the caller's buffers; the kernel lab
// runs it with its own, around a variant of the kernel.
type Launch struct {
	Kernel string // the built-in (Builtin)
	// Constants are the override constants the rule sets (tile sizes the
	// grid was computed with): they win over a variant's own.
	Constants map[string]float64
	Groups    [3]uint32
	Params    gpu.Params
	Bindings  []Binding // in ABI order
}

// A Binding is what a Launch needs of one storage binding.
type Binding struct {
	Name  string // what the op calls it ("x", "weights")
	Bytes uint64 // the least bytes the shape reads or writes through it
}

// Kernels runs the built-in kernels on a device. Pipelines compile on first
// use (one per constant variant) and stay until Close. Methods record into
// a Batch and never wait for the GPU; ctx bounds compilation. Errors are
// *gpu.KernelError values naming the kernel (ErrShape for a bad shape or
// a binding too small); each also fails the batch (gpu.Batch.Fail). Safe
// for concurrent use (each Batch by one goroutine).
type Kernels struct {
	d      *gpu.Device
	mu     sync.Mutex
	pipes  map[string]*gpu.Pipeline
	closed bool
}

// NewKernels prepares the built-in kernels for d. A kernel that d has a
// variant of (gpu.Device.UseVariant) compiles as that variant.
func NewKernels(d *gpu.Device) *Kernels { return &Kernels{d: d, pipes: map[string]*gpu.Pipeline{}} }

// Close releases the kernels' pipelines.
func (k *Kernels) Close() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.closed = true
	for _, p := range k.pipes {
		p.Release()
	}
	k.pipes = map[string]*gpu.Pipeline{}
}

func (k *Kernels) pipeline(ctx context.Context, name string, consts map[string]float64) (*gpu.Pipeline, error) {
	// The key is built on every dispatch: no fmt, one allocation.
	key := name
	if len(consts) > 0 {
		var names [16]string
		cs := names[:0]
		for c := range consts {
			cs = append(cs, c)
		}
		sort.Strings(cs)
		buf := make([]byte, 0, 64)
		buf = append(buf, name...)
		for _, c := range cs {
			buf = append(buf, ',')
			buf = append(buf, c...)
			buf = append(buf, '=')
			buf = strconv.AppendFloat(buf, consts[c], 'g', -1, 64)
		}
		key = string(buf)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, &gpu.KernelError{Kernel: name, Op: "compile", Err: gpu.ErrClosed}
	}
	if p, ok := k.pipes[key]; ok {
		return p, nil
	}
	spec, err := Builtin(name, consts)
	if err != nil {
		return nil, err
	}
	p, err := k.d.Compile(ctx, spec)
	if err != nil {
		return nil, err
	}
	k.pipes[key] = p
	return p, nil
}

// Prepare compiles the default variants of every built-in kernel, so that
// the first decode step does not pay for compilation.
func (k *Kernels) Prepare(ctx context.Context) error {
	for _, n := range BuiltinNames() {
		if _, err := k.pipeline(ctx, n, nil); err != nil {
			return err
		}
	}
	return nil
}

// record checks bind against l's bindings, compiles l's kernel (if
// needed) and records the dispatch.
func (k *Kernels) record(ctx context.Context, b *gpu.Batch, l Launch, bind ...gpu.Region) error {
	if len(bind) != len(l.Bindings) {
		return b.Fail(shapeErr(l.Kernel, "%d bindings; the kernel takes %d", len(bind), len(l.Bindings)))
	}
	for i, r := range bind {
		if err := need(l.Kernel, l.Bindings[i].Name, r, l.Bindings[i].Bytes); err != nil {
			return b.Fail(err)
		}
	}
	p, err := k.pipeline(ctx, l.Kernel, l.Constants)
	if err != nil {
		return b.Fail(err)
	}
	return b.Dispatch(p, l.Groups, l.Params, bind...)
}

// launch records l when the rule gave no error.
func (k *Kernels) launch(ctx context.Context, b *gpu.Batch, l Launch, err error, bind ...gpu.Region) error {
	if err != nil {
		return b.Fail(err)
	}
	return k.record(ctx, b, l, bind...)
}

func shapeErr(kernel, format string, args ...any) error {
	return &gpu.KernelError{Kernel: kernel, Op: "shape", Err: fmt.Errorf("%w: "+format, append([]any{gpu.ErrShape}, args...)...)}
}

// need checks that r holds at least n bytes.
func need(kernel, what string, r gpu.Region, n uint64) error {
	if r == nil {
		return shapeErr(kernel, "%s is nil", what)
	}
	if s := gpu.SpanOf(r); s.Size() < n {
		return shapeErr(kernel, "%s holds %d bytes; the shape needs %d", what, s.Size(), n)
	}
	return nil
}

// grid spreads n workgroups over x and y (each <= 65535): the grid of
// every one-dimensional rule.
func grid(n uint64) (gx, gy uint32) {
	if n <= 65535 {
		return uint32(max(n, 1)), 1
	}
	gy = uint32((n + 65534) / 65535)
	gx = uint32((n + uint64(gy) - 1) / uint64(gy))
	return gx, gy
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

func floorPow2(n uint64) uint64 {
	if n == 0 {
		return 1
	}
	return 1 << (bits.Len64(n) - 1)
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

func b2u(v bool) uint32 {
	if v {
		return 1
	}
	return 0
}
