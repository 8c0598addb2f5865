package gpu

import (
	"errors"
	"fmt"
)

var (
	// ErrNoAdapter: no adapter of the requested backend exists.
	ErrNoAdapter = errors.New("gpu: no adapter")
	// ErrUnsupported: the adapter or the binding lacks something required.
	ErrUnsupported = errors.New("gpu: unsupported")
	// ErrLimit: a request exceeds what the device or adapter can hold (a
	// buffer larger than the maximum buffer size, a binding larger than the
	// maximum storage binding, too many workgroups).
	ErrLimit = errors.New("gpu: over device limit")
	// ErrOutOfMemory: the device could not allocate what was asked.
	ErrOutOfMemory = errors.New("gpu: out of device memory")
	// ErrDeviceLost: the device was lost (driver reset, destroyed). The
	// Device is unusable; Close it and Open a new one.
	ErrDeviceLost = errors.New("gpu: device lost")
	// ErrClosed: the Device (or a Batch, a Buffer, gpu/ops.Kernels) was closed or released.
	ErrClosed = errors.New("gpu: closed")
	// ErrCompile: a kernel's WGSL failed to compile or to build a pipeline.
	ErrCompile = errors.New("gpu: kernel compile failed")
	// ErrShape: arguments do not describe a valid shape for the kernel.
	ErrShape = errors.New("gpu: bad shape")
	// ErrValidation: wgpu rejected a call (the message says why).
	ErrValidation = errors.New("gpu: validation error")
)

// KernelError names the kernel (and the step) that failed. It wraps one of
// the sentinels above, so errors.Is(err, ErrCompile) and friends work.
type KernelError struct {
	Kernel string // kernel name, such as "q4k_matvec"
	Op     string // what was being done: "compile", "dispatch", "submit"
	Err    error
}

func (e *KernelError) Error() string {
	return fmt.Sprintf("gpu: kernel %s: %s: %v", e.Kernel, e.Op, e.Err)
}

func (e *KernelError) Unwrap() error { return e.Err }

// wrapNative turns an error that a wgpu error scope captured into an error
// wrapping the matching sentinel.
func wrapNative(ne *nativeError) error {
	if ne == nil {
		return nil
	}
	switch ne.typ {
	case errTypeOutOfMemory:
		return fmt.Errorf("%w: %s", ErrOutOfMemory, ne.msg)
	case errTypeDeviceLost:
		return fmt.Errorf("%w: %s", ErrDeviceLost, ne.msg)
	default:
		return fmt.Errorf("%w: %s", ErrValidation, ne.msg)
	}
}
