// Declarations of the few wgpu-native C entry points that package gpu calls
// directly, plus its own helpers (shim.c). The binding
// (github.com/cogentcore/webgpu) passes the address of a Go variable as the
// userdata of asynchronous callbacks (MapAsync, OnSubmittedWorkDone); the
// garbage collector may free it before the callback runs, and the process
// then panics inside the callback. These helpers pass a cgo.Handle by value
// instead, and wrap calls in error scopes for every filter, since wgpu-native
// aborts the process on an error that no scope captures
// (the binding scopes validation errors only, never out-of-memory ones).
#ifndef RDRR_GPU_SHIM_H
#define RDRR_GPU_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct rdrr_error {
	uint32_t type; // WGPUErrorType; 0 = none
	char msg[1024];
} rdrr_error;

void rdrr_push_scopes(void *device);
void rdrr_pop_scopes(void *device, rdrr_error *err);
void rdrr_map_async(void *device, void *buffer, uint32_t mode, size_t offset, size_t size, uintptr_t handle, rdrr_error *err);
void rdrr_on_done(void *device, void *queue, uintptr_t handle, rdrr_error *err);
uint64_t rdrr_submit(void *device, void *queue, size_t n, void **cmds, rdrr_error *err);
uint64_t rdrr_buffer_size(void *buffer);
void *rdrr_create_instance(uint32_t backends);
void *rdrr_begin_timed_pass(void *device, void *encoder, void *query_set, uint32_t begin, uint32_t end);

#endif
