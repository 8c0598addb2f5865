#include <string.h>
#include "shim.h"

// Types and prototypes from webgpu.h / wgpu.h (wgpu-native v22, as linked by
// github.com/cogentcore/webgpu v0.23.0). Declared weak so that building this
// package alone needs no library; the binding links libwgpu_native.a.
typedef void (*rdrr_error_cb)(uint32_t type, char const *message, void *userdata);
typedef void (*rdrr_status_cb)(uint32_t status, void *userdata);

extern void wgpuDevicePushErrorScope(void *device, uint32_t filter) __attribute__((weak));
extern void wgpuDevicePopErrorScope(void *device, rdrr_error_cb cb, void *userdata) __attribute__((weak));
extern void wgpuBufferMapAsync(void *buffer, uint32_t mode, size_t offset, size_t size, rdrr_status_cb cb, void *userdata) __attribute__((weak));
extern void wgpuQueueOnSubmittedWorkDone(void *queue, rdrr_status_cb cb, void *userdata) __attribute__((weak));
extern uint64_t wgpuQueueSubmitForIndex(void *queue, size_t n, void *const *cmds) __attribute__((weak));
extern uint64_t wgpuBufferGetSize(void *buffer) __attribute__((weak));
extern void *wgpuCreateInstance(void const *descriptor) __attribute__((weak));
extern void *wgpuCommandEncoderBeginComputePass(void *encoder, void const *descriptor) __attribute__((weak));
extern void wgpuDeviceReference(void *device) __attribute__((weak));

// WGPUChainedStruct and WGPUInstanceExtras of wgpu.h, WGPUInstanceDescriptor
// of webgpu.h.
typedef struct rdrr_chained {
	struct rdrr_chained const *next;
	uint32_t sType;
} rdrr_chained;
typedef struct {
	rdrr_chained chain;
	uint32_t backends;
	uint32_t flags;
	uint32_t dx12ShaderCompiler;
	uint32_t gles3MinorVersion;
	char const *dxilPath;
	char const *dxcPath;
} rdrr_instance_extras;
typedef struct {
	rdrr_chained const *nextInChain;
} rdrr_instance_descriptor;
enum { STYPE_INSTANCE_EXTRAS = 0x00030006 };

// Implemented in Go (callback.go).
extern void rdrrMapDone(uint32_t status, uintptr_t handle);
extern void rdrrWorkDone(uint32_t status, uintptr_t handle);

enum { FILTER_VALIDATION = 0, FILTER_OOM = 1 };

static void keep_first(uint32_t type, char const *message, void *userdata) {
	rdrr_error *e = (rdrr_error *)userdata;
	if (type == 0 || e->type != 0) {
		return;
	}
	e->type = type;
	if (message != NULL) {
		strncpy(e->msg, message, sizeof(e->msg) - 1);
		e->msg[sizeof(e->msg) - 1] = 0;
	}
}

// wgpu-native v22 accepts the validation and out-of-memory filters only (it
// panics on FILTER_INTERNAL).
void rdrr_push_scopes(void *device) {
	wgpuDevicePushErrorScope(device, FILTER_OOM);
	wgpuDevicePushErrorScope(device, FILTER_VALIDATION);
}

void rdrr_pop_scopes(void *device, rdrr_error *err) {
	wgpuDevicePopErrorScope(device, keep_first, err);
	wgpuDevicePopErrorScope(device, keep_first, err);
}

static void map_cb(uint32_t status, void *userdata) { rdrrMapDone(status, (uintptr_t)userdata); }
static void done_cb(uint32_t status, void *userdata) { rdrrWorkDone(status, (uintptr_t)userdata); }

void rdrr_map_async(void *device, void *buffer, uint32_t mode, size_t offset, size_t size, uintptr_t handle, rdrr_error *err) {
	rdrr_push_scopes(device);
	wgpuBufferMapAsync(buffer, mode, offset, size, map_cb, (void *)handle);
	rdrr_pop_scopes(device, err);
}

void rdrr_on_done(void *device, void *queue, uintptr_t handle, rdrr_error *err) {
	rdrr_push_scopes(device);
	wgpuQueueOnSubmittedWorkDone(queue, done_cb, (void *)handle);
	rdrr_pop_scopes(device, err);
}

uint64_t rdrr_submit(void *device, void *queue, size_t n, void **cmds, rdrr_error *err) {
	rdrr_push_scopes(device);
	uint64_t idx = wgpuQueueSubmitForIndex(queue, n, cmds);
	rdrr_pop_scopes(device, err);
	return idx;
}

uint64_t rdrr_buffer_size(void *buffer) { return wgpuBufferGetSize(buffer); }

// rdrr_create_instance creates an instance for the given backends only
// (WGPUInstanceBackend flags), every other field zero: the defaults.
void *rdrr_create_instance(uint32_t backends) {
	rdrr_instance_extras extras;
	memset(&extras, 0, sizeof extras);
	extras.chain.sType = STYPE_INSTANCE_EXTRAS;
	extras.backends = backends;
	rdrr_instance_descriptor desc = {&extras.chain};
	return wgpuCreateInstance(&desc);
}

// WGPUComputePassTimestampWrites and WGPUComputePassDescriptor of webgpu.h
// (the binding's ComputePassDescriptor has no timestamp writes).
typedef struct {
	void *querySet;
	uint32_t beginningOfPassWriteIndex;
	uint32_t endOfPassWriteIndex;
} rdrr_pass_timestamps;
typedef struct {
	void const *nextInChain;
	char const *label;
	rdrr_pass_timestamps const *timestampWrites;
} rdrr_pass_descriptor;

// rdrr_begin_timed_pass begins a compute pass that writes GPU timestamps
// into query_set at its beginning (query begin) and end (query end). It
// takes a reference on device, which the binding's ComputePassEncoder
// releases with the pass.
void *rdrr_begin_timed_pass(void *device, void *encoder, void *query_set, uint32_t begin, uint32_t end) {
	rdrr_pass_timestamps ts = {query_set, begin, end};
	rdrr_pass_descriptor desc = {NULL, NULL, &ts};
	void *pass = wgpuCommandEncoderBeginComputePass(encoder, &desc);
	if (pass != NULL) {
		wgpuDeviceReference(device);
	}
	return pass;
}
