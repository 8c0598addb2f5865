package gpu

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"unsafe"

	"github.com/cogentcore/webgpu/wgpu"
)

// The binding keeps each native handle as the only (or the second) field of
// its wrapper struct. These accessors read it so that shim.c can call
// wgpu-native directly; checkLayout verifies the assumption when a device
// opens, so a binding upgrade that changes the layout fails loudly instead of
// passing garbage to C.

func nativeDevice(d *wgpu.Device) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(d)) }

func nativeBuffer(b *wgpu.Buffer) unsafe.Pointer {
	return (*[2]unsafe.Pointer)(unsafe.Pointer(b))[1]
}

func nativeQueue(q *wgpu.Queue) unsafe.Pointer {
	return (*[2]unsafe.Pointer)(unsafe.Pointer(q))[1]
}

func nativeCommandBuffer(c *wgpu.CommandBuffer) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(c))
}

// beginTimedPass begins a compute pass of enc that writes GPU timestamps
// into qs at queries begin and end (the binding cannot: its
// ComputePassDescriptor has no timestamp writes). The encoder and pass
// wrappers are {device, handle}, the query set's {handle} (checkLayout).
func beginTimedPass(dev *wgpu.Device, enc *wgpu.CommandEncoder, qs *wgpu.QuerySet, begin, end uint32) *wgpu.ComputePassEncoder {
	devRaw := nativeDevice(dev)
	p := C.rdrr_begin_timed_pass(devRaw, (*[2]unsafe.Pointer)(unsafe.Pointer(enc))[1], *(*unsafe.Pointer)(unsafe.Pointer(qs)), C.uint32_t(begin), C.uint32_t(end))
	if p == nil {
		return nil
	}
	return (*wgpu.ComputePassEncoder)(unsafe.Pointer(&[2]unsafe.Pointer{devRaw, p}))
}

func checkLayout(dev *wgpu.Device, probe *wgpu.Buffer, size uint64) error {
	var (
		d  wgpu.Device
		b  wgpu.Buffer
		q  wgpu.Queue
		c  wgpu.CommandBuffer
		e  wgpu.CommandEncoder
		p  wgpu.ComputePassEncoder
		qs wgpu.QuerySet
	)
	ptr := unsafe.Sizeof(uintptr(0))
	if unsafe.Sizeof(d) != ptr || unsafe.Sizeof(b) != 2*ptr || unsafe.Sizeof(q) != 2*ptr || unsafe.Sizeof(c) != ptr ||
		unsafe.Sizeof(e) != 2*ptr || unsafe.Sizeof(p) != 2*ptr || unsafe.Sizeof(qs) != ptr {
		return fmt.Errorf("%w: webgpu binding struct layout changed", ErrUnsupported)
	}
	if nativeDevice(dev) == nil {
		return fmt.Errorf("%w: webgpu binding returned a nil device", ErrUnsupported)
	}
	if got := uint64(C.rdrr_buffer_size(nativeBuffer(probe))); got != size {
		return fmt.Errorf("%w: webgpu binding layout changed (probe buffer size %d; want %d)", ErrUnsupported, got, size)
	}
	return nil
}

// createInstance creates an instance for the backends in flags alone, or
// returns nil if it cannot (the binding's Instance no longer a lone handle,
// or wgpu-native refused).
func createInstance(flags wgpu.InstanceBackend) *wgpu.Instance {
	var probe wgpu.Instance
	if unsafe.Sizeof(probe) != unsafe.Sizeof(uintptr(0)) {
		return nil
	}
	p := C.rdrr_create_instance(C.uint32_t(flags))
	if p == nil {
		return nil
	}
	inst := new(wgpu.Instance)
	*(*unsafe.Pointer)(unsafe.Pointer(inst)) = p
	return inst
}

// nativeError is an error that a wgpu error scope captured.
type nativeError struct {
	typ uint32 // WGPUErrorType
	msg string
}

const (
	errTypeValidation  = 1
	errTypeOutOfMemory = 2
	errTypeInternal    = 3
	errTypeUnknown     = 4
	errTypeDeviceLost  = 5
)

func toNativeError(e *C.rdrr_error) *nativeError {
	if e._type == 0 {
		return nil
	}
	return &nativeError{typ: uint32(e._type), msg: C.GoString(&e.msg[0])}
}

// scoped runs f inside validation and out-of-memory error scopes and returns the first error any of them captured. The
// binding wraps its own calls in a validation scope only; without an outer
// scope an out-of-memory error would abort the process. Callers hold d.mu.
func scoped(dev *wgpu.Device, f func()) *nativeError {
	var e C.rdrr_error
	p := nativeDevice(dev)
	C.rdrr_push_scopes(p)
	f()
	C.rdrr_pop_scopes(p, &e)
	return toNativeError(&e)
}

// mapAsync starts mapping b and calls done(status) from the polling thread
// (or from inside a later wgpu call) once the mapping resolves. done must not
// call back into the device.
func mapAsync(dev *wgpu.Device, b *wgpu.Buffer, mode wgpu.MapMode, off, size uint64, done func(status uint32)) *nativeError {
	h := cgo.NewHandle(done)
	var e C.rdrr_error
	C.rdrr_map_async(nativeDevice(dev), nativeBuffer(b), C.uint32_t(mode), C.size_t(off), C.size_t(size), C.uintptr_t(h), &e)
	if ne := toNativeError(&e); ne != nil {
		// wgpu-native still calls back with an error status after a
		// validation error; the callback deletes the handle.
		return ne
	}
	return nil
}

// onWorkDone calls done(status) once all work submitted so far has finished.
func onWorkDone(dev *wgpu.Device, q *wgpu.Queue, done func(status uint32)) *nativeError {
	h := cgo.NewHandle(done)
	var e C.rdrr_error
	C.rdrr_on_done(nativeDevice(dev), nativeQueue(q), C.uintptr_t(h), &e)
	return toNativeError(&e)
}

// submit submits command buffers, in order, as one queue submission and
// returns its index.
// wgpu-native treats every submit error as fatal (scopes do not capture it),
// so callers must check beforehand that no buffer in cb is destroyed or
// mapped; the scopes here catch out-of-memory errors.
func submit(dev *wgpu.Device, q *wgpu.Queue, cbs ...*wgpu.CommandBuffer) (uint64, *nativeError) {
	var e C.rdrr_error
	n := len(cbs)
	ptrs := unsafe.Slice((*unsafe.Pointer)(C.malloc(C.size_t(n)*C.size_t(unsafe.Sizeof(uintptr(0))))), n)
	defer C.free(unsafe.Pointer(&ptrs[0]))
	for i, cb := range cbs {
		ptrs[i] = nativeCommandBuffer(cb)
	}
	idx := C.rdrr_submit(nativeDevice(dev), nativeQueue(q), C.size_t(n), &ptrs[0], &e)
	return uint64(idx), toNativeError(&e)
}

//export rdrrMapDone
func rdrrMapDone(status C.uint32_t, handle C.uintptr_t) {
	h := cgo.Handle(handle)
	f := h.Value().(func(uint32))
	h.Delete()
	f(uint32(status))
}

//export rdrrWorkDone
func rdrrWorkDone(status C.uint32_t, handle C.uintptr_t) {
	h := cgo.Handle(handle)
	f := h.Value().(func(uint32))
	h.Delete()
	f(uint32(status))
}
