// vkstats: a Vulkan layer that says what the driver made of each compute
// pipeline. It turns on VK_KHR_pipeline_executable_properties where the
// device offers it, asks every vkCreateComputePipelines for its
// statistics (on NVIDIA: registers a thread, shared memory, binary size)
// and writes one line a pipeline to stderr:
//
//   vkstats: module 12 entry main spv 0x1a2b3c4d5e6f7788 | Register Count=96 | ...
//
// With VKSTATS_DIR set it also keeps each shader module's SPIR-V there
// (module-PID-12.spv), for spirv-dis. A tool for measuring kernels, not part
// of peer: see README.md for how to turn it on.

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vulkan/vk_layer.h>
#include <vulkan/vulkan.h>

#define EXPORT __attribute__((visibility("default")))
#define MAXH 256  // live instances and devices (entries are cleared on destroy)
#define MAXM 4096 // the last shader modules created (a ring)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

struct inst {
	VkInstance h;
	PFN_vkGetInstanceProcAddr gipa;
	PFN_vkDestroyInstance destroy; // the next layer's, asked for at creation
};
static struct inst insts[MAXH];

struct dev {
	VkDevice h;
	PFN_vkGetDeviceProcAddr gdpa;
	PFN_vkDestroyDevice destroy; // the next layer's, asked for at creation
	int stats;                   // the extension was enabled
};
static struct dev devs[MAXH];

static struct {
	VkShaderModule h;
	int id;
	uint64_t hash;
} mods[MAXM];
static int nmods; // modules created: the next one's id

// instIndex and devIndex are the table entries of h, or -1; of
// VK_NULL_HANDLE, a free one. Called with mu held.
static int instIndex(VkInstance h) {
	for (int i = 0; i < MAXH; i++)
		if (insts[i].h == h) return i;
	return -1;
}

static PFN_vkGetInstanceProcAddr instGIPA(VkInstance h) {
	pthread_mutex_lock(&mu);
	int i = instIndex(h);
	PFN_vkGetInstanceProcAddr f = i >= 0 ? insts[i].gipa : NULL;
	if (!f) // any: the loader's terminators are per-ICD, not per-instance
		for (int i = 0; i < MAXH; i++)
			if (insts[i].gipa) f = insts[i].gipa;
	pthread_mutex_unlock(&mu);
	return f;
}

static int devIndex(VkDevice h) {
	for (int i = 0; i < MAXH; i++)
		if (devs[i].h == h) return i;
	return -1;
}

static PFN_vkVoidFunction devProc(VkDevice h, const char *name) {
	pthread_mutex_lock(&mu);
	int i = devIndex(h);
	PFN_vkGetDeviceProcAddr f = i >= 0 ? devs[i].gdpa : NULL;
	pthread_mutex_unlock(&mu);
	return f ? f(h, name) : NULL;
}

static VKAPI_ATTR VkResult VKAPI_CALL CreateInstance(const VkInstanceCreateInfo *ci, const VkAllocationCallbacks *a, VkInstance *out) {
	VkLayerInstanceCreateInfo *li = (VkLayerInstanceCreateInfo *)ci->pNext;
	while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
		li = (VkLayerInstanceCreateInfo *)li->pNext;
	if (!li) return VK_ERROR_INITIALIZATION_FAILED;
	PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
	li->u.pLayerInfo = li->u.pLayerInfo->pNext;
	PFN_vkCreateInstance create = (PFN_vkCreateInstance)gipa(VK_NULL_HANDLE, "vkCreateInstance");
	VkResult r = create(ci, a, out);
	if (r != VK_SUCCESS) return r;
	// Asked for now: at destroy time the loader's answer crashed.
	PFN_vkDestroyInstance destroy = (PFN_vkDestroyInstance)gipa(*out, "vkDestroyInstance");
	pthread_mutex_lock(&mu);
	int slot = instIndex(VK_NULL_HANDLE);
	if (slot >= 0) insts[slot] = (struct inst){*out, gipa, destroy};
	pthread_mutex_unlock(&mu);
	if (slot < 0) {
		fprintf(stderr, "vkstats: more than %d live instances\n", MAXH);
		if (destroy) destroy(*out, a);
		*out = VK_NULL_HANDLE;
		return VK_ERROR_INITIALIZATION_FAILED;
	}
	return r;
}

static int offers(PFN_vkGetInstanceProcAddr gipa, VkPhysicalDevice pd, const char *ext) {
	VkInstance inst = VK_NULL_HANDLE; // the newest live one: gpu.Open makes one
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXH; i++)
		if (insts[i].h) inst = insts[i].h;
	pthread_mutex_unlock(&mu);
	PFN_vkEnumerateDeviceExtensionProperties en =
		(PFN_vkEnumerateDeviceExtensionProperties)gipa(inst, "vkEnumerateDeviceExtensionProperties");
	if (!en) return 0;
	uint32_t n = 0;
	if (en(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return 0;
	VkExtensionProperties *p = calloc(n, sizeof *p);
	int found = 0;
	if (p && en(pd, NULL, &n, p) == VK_SUCCESS)
		for (uint32_t i = 0; i < n; i++)
			if (!strcmp(p[i].extensionName, ext)) found = 1;
	free(p);
	return found;
}

static VKAPI_ATTR VkResult VKAPI_CALL CreateDevice(VkPhysicalDevice pd, const VkDeviceCreateInfo *ci, const VkAllocationCallbacks *a, VkDevice *out) {
	VkLayerDeviceCreateInfo *li = (VkLayerDeviceCreateInfo *)ci->pNext;
	while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
		li = (VkLayerDeviceCreateInfo *)li->pNext;
	if (!li) return VK_ERROR_INITIALIZATION_FAILED;
	PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
	PFN_vkGetDeviceProcAddr gdpa = li->u.pLayerInfo->pfnNextGetDeviceProcAddr;
	li->u.pLayerInfo = li->u.pLayerInfo->pNext;
	VkLayerDeviceLink *below = li->u.pLayerInfo; // a retry starts the chain here again
	PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(VK_NULL_HANDLE, "vkCreateDevice");

	const char *ext = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
	int stats = offers(gipa, pd, ext);
	VkDeviceCreateInfo c = *ci;
	const char **names = NULL;
	VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR feat = {
		.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
		.pipelineExecutableInfo = VK_TRUE,
	};
	if (stats) {
		int have = 0;
		for (uint32_t i = 0; i < ci->enabledExtensionCount; i++)
			if (!strcmp(ci->ppEnabledExtensionNames[i], ext)) have = 1;
		if (!have) {
			names = calloc(ci->enabledExtensionCount + 1, sizeof *names);
			if (!names) return VK_ERROR_OUT_OF_HOST_MEMORY;
			if (ci->enabledExtensionCount)
				memcpy(names, ci->ppEnabledExtensionNames, ci->enabledExtensionCount * sizeof *names);
			names[ci->enabledExtensionCount] = ext;
			c.ppEnabledExtensionNames = names;
			c.enabledExtensionCount++;
		}
		// The feature once: an application that chains it decides it.
		int chained = 0;
		for (const VkBaseInStructure *b = c.pNext; b; b = b->pNext)
			if (b->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR) {
				chained = 1;
				stats = ((const VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR *)b)->pipelineExecutableInfo;
			}
		if (!chained) {
			feat.pNext = (void *)c.pNext;
			c.pNext = &feat;
		}
	}
	VkResult r = create(pd, &c, a, out);
	if ((r == VK_ERROR_EXTENSION_NOT_PRESENT || r == VK_ERROR_FEATURE_NOT_PRESENT) && c.pNext != ci->pNext) {
		fprintf(stderr, "vkstats: vkCreateDevice with %s failed (%d); without it\n", ext, r);
		stats = 0;
		li->u.pLayerInfo = below;
		r = create(pd, ci, a, out);
	}
	free(names);
	if (r != VK_SUCCESS) return r;
	PFN_vkDestroyDevice destroy = (PFN_vkDestroyDevice)gdpa(*out, "vkDestroyDevice");
	pthread_mutex_lock(&mu);
	int slot = devIndex(VK_NULL_HANDLE);
	if (slot >= 0) devs[slot] = (struct dev){*out, gdpa, destroy, stats};
	pthread_mutex_unlock(&mu);
	if (slot < 0) { // its calls would find no next layer
		fprintf(stderr, "vkstats: more than %d live devices\n", MAXH);
		if (destroy) destroy(*out, a);
		*out = VK_NULL_HANDLE;
		return VK_ERROR_INITIALIZATION_FAILED;
	}
	fprintf(stderr, "vkstats: device %p, statistics %s\n", (void *)*out, stats ? "on" : "not offered");
	return r;
}

static VKAPI_ATTR void VKAPI_CALL DestroyDevice(VkDevice d, const VkAllocationCallbacks *a) {
	if (!d) return; // a no-op, and VK_NULL_HANDLE is a free entry's
	PFN_vkDestroyDevice f = NULL;
	pthread_mutex_lock(&mu);
	int i = devIndex(d);
	if (i >= 0) {
		f = devs[i].destroy;
		devs[i].h = VK_NULL_HANDLE;
	}
	pthread_mutex_unlock(&mu);
	if (f) f(d, a);
}

static VKAPI_ATTR void VKAPI_CALL DestroyInstance(VkInstance h, const VkAllocationCallbacks *a) {
	if (!h) return; // a no-op, and VK_NULL_HANDLE is a free entry's
	PFN_vkDestroyInstance f = NULL;
	pthread_mutex_lock(&mu);
	int i = instIndex(h);
	if (i >= 0) {
		f = insts[i].destroy;
		insts[i].h = VK_NULL_HANDLE;
	}
	pthread_mutex_unlock(&mu);
	if (f) f(h, a);
}

static VKAPI_ATTR VkResult VKAPI_CALL CreateShaderModule(VkDevice d, const VkShaderModuleCreateInfo *ci, const VkAllocationCallbacks *a, VkShaderModule *out) {
	PFN_vkCreateShaderModule f = (PFN_vkCreateShaderModule)devProc(d, "vkCreateShaderModule");
	if (!f) return VK_ERROR_INITIALIZATION_FAILED;
	VkResult r = f(d, ci, a, out);
	if (r != VK_SUCCESS) return r;
	uint64_t h = 0xcbf29ce484222325ull; // FNV-1a of the SPIR-V
	const unsigned char *b = (const unsigned char *)ci->pCode;
	for (size_t i = 0; i < ci->codeSize; i++) h = (h ^ b[i]) * 0x100000001b3ull;
	pthread_mutex_lock(&mu);
	int id = nmods++;
	mods[id % MAXM].h = *out;
	mods[id % MAXM].id = id;
	mods[id % MAXM].hash = h;
	pthread_mutex_unlock(&mu);
	const char *dir = getenv("VKSTATS_DIR");
	if (dir) {
		char path[4096];
		snprintf(path, sizeof path, "%s/module-%d-%d.spv", dir, (int)getpid(), id);
		FILE *fp = fopen(path, "wb");
		if (fp) {
			fwrite(ci->pCode, 1, ci->codeSize, fp);
			fclose(fp);
		}
	}
	return r;
}

static void moduleOf(VkShaderModule m, int *id, uint64_t *hash) {
	*id = -1;
	*hash = 0;
	pthread_mutex_lock(&mu);
	for (int n = 0; n < MAXM && n < nmods; n++) { // newest first
		int i = (nmods - 1 - n) % MAXM;
		if (mods[i].h == m) {
			*id = mods[i].id;
			*hash = mods[i].hash;
			break;
		}
	}
	pthread_mutex_unlock(&mu);
}

// dumpIR writes what the driver shows of each executable's internal
// representations (if anything) to VKSTATS_DIR/module-PID-ID.eE.rR.txt.
static void dumpIR(VkDevice d, VkPipeline p, uint32_t ne, int id) {
	const char *dir = getenv("VKSTATS_DIR");
	PFN_vkGetPipelineExecutableInternalRepresentationsKHR irs =
		(PFN_vkGetPipelineExecutableInternalRepresentationsKHR)devProc(d, "vkGetPipelineExecutableInternalRepresentationsKHR");
	if (!dir || !irs) return;
	for (uint32_t e = 0; e < ne && e < 8; e++) {
		VkPipelineExecutableInfoKHR ei = {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, .pipeline = p, .executableIndex = e};
		uint32_t n = 0;
		if (irs(d, &ei, &n, NULL) != VK_SUCCESS || n == 0) continue;
		if (n > 16) n = 16;
		VkPipelineExecutableInternalRepresentationKHR r[16];
		for (uint32_t i = 0; i < n; i++) r[i] = (VkPipelineExecutableInternalRepresentationKHR){.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR};
		if (irs(d, &ei, &n, r) < 0) continue;
		for (uint32_t i = 0; i < n; i++) {
			if (r[i].dataSize == 0 || r[i].dataSize > (64u << 20)) continue;
			r[i].pData = malloc(r[i].dataSize);
		}
		VkResult res = irs(d, &ei, &n, r);
		for (uint32_t i = 0; i < n; i++) {
			if (res >= 0 && r[i].pData) {
				char path[4096];
				snprintf(path, sizeof path, "%s/module-%d-%d.e%u.r%u.%s", dir, (int)getpid(), id, e, i, r[i].isText ? "txt" : "bin");
				FILE *fp = fopen(path, "wb");
				if (fp) {
					fprintf(stderr, "vkstats: module %d: %s (%s), %zu bytes\n", id, r[i].name, r[i].description, r[i].dataSize);
					fwrite(r[i].pData, 1, r[i].isText ? strnlen(r[i].pData, r[i].dataSize) : r[i].dataSize, fp);
					fclose(fp);
				}
			}
			free(r[i].pData);
		}
	}
}

// report writes pipeline p's line: its module and entry, then, where the
// statistics were captured (on), each statistic.
static void report(VkDevice d, VkPipeline p, const VkComputePipelineCreateInfo *ci, int on) {
	PFN_vkGetPipelineExecutablePropertiesKHR props = on ?
		(PFN_vkGetPipelineExecutablePropertiesKHR)devProc(d, "vkGetPipelineExecutablePropertiesKHR") : NULL;
	PFN_vkGetPipelineExecutableStatisticsKHR stats = on ?
		(PFN_vkGetPipelineExecutableStatisticsKHR)devProc(d, "vkGetPipelineExecutableStatisticsKHR") : NULL;
	int id;
	uint64_t hash;
	moduleOf(ci->stage.module, &id, &hash);
	char line[8192];
	int n = snprintf(line, sizeof line, "vkstats: module %d entry %s spv 0x%016llx", id, ci->stage.pName, (unsigned long long)hash);
	if (!props || !stats) {
		fprintf(stderr, "%s | no statistics\n", line);
		return;
	}
	VkPipelineInfoKHR pi = {.sType = VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, .pipeline = p};
	uint32_t ne = 0;
	if (props(d, &pi, &ne, NULL) != VK_SUCCESS) ne = 0;
	for (uint32_t e = 0; e < ne && e < 8; e++) {
		VkPipelineExecutableInfoKHR ei = {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, .pipeline = p, .executableIndex = e};
		uint32_t ns = 0;
		if (stats(d, &ei, &ns, NULL) != VK_SUCCESS || ns == 0) continue;
		if (ns > 64) ns = 64;
		VkPipelineExecutableStatisticKHR st[64];
		for (uint32_t i = 0; i < ns; i++) st[i] = (VkPipelineExecutableStatisticKHR){.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR};
		if (stats(d, &ei, &ns, st) < 0) continue;
		for (uint32_t i = 0; i < ns && n < (int)sizeof line - 128; i++) {
			switch (st[i].format) {
			case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
				n += snprintf(line + n, sizeof line - n, " | %s=%s", st[i].name, st[i].value.b32 ? "true" : "false");
				break;
			case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
				n += snprintf(line + n, sizeof line - n, " | %s=%lld", st[i].name, (long long)st[i].value.i64);
				break;
			case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
				n += snprintf(line + n, sizeof line - n, " | %s=%llu", st[i].name, (unsigned long long)st[i].value.u64);
				break;
			case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR:
				n += snprintf(line + n, sizeof line - n, " | %s=%g", st[i].name, st[i].value.f64);
				break;
			default:
				break;
			}
		}
	}
	fprintf(stderr, "%s\n", line);
	dumpIR(d, p, ne, id);
}

static VKAPI_ATTR VkResult VKAPI_CALL CreateComputePipelines(VkDevice d, VkPipelineCache cache, uint32_t count,
	const VkComputePipelineCreateInfo *ci, const VkAllocationCallbacks *a, VkPipeline *out) {
	PFN_vkCreateComputePipelines f = (PFN_vkCreateComputePipelines)devProc(d, "vkCreateComputePipelines");
	if (!f) return VK_ERROR_INITIALIZATION_FAILED;
	pthread_mutex_lock(&mu);
	int i = devIndex(d), on = i >= 0 && devs[i].stats && count <= 64;
	pthread_mutex_unlock(&mu);
	VkComputePipelineCreateInfo c[64];
	const VkComputePipelineCreateInfo *use = ci;
	if (on) {
		for (uint32_t k = 0; k < count; k++) {
			c[k] = ci[k];
			c[k].flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
			if (getenv("VKSTATS_DIR")) c[k].flags |= VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
		}
		use = c;
	}
	VkResult r = f(d, cache, count, use, a, out);
	if (r == VK_SUCCESS)
		for (uint32_t k = 0; k < count; k++) report(d, out[k], &ci[k], on);
	return r;
}

static PFN_vkVoidFunction ours(const char *name) {
#define OURS(n) \
	if (!strcmp(name, "vk" #n)) return (PFN_vkVoidFunction)n;
	OURS(CreateDevice)
	OURS(DestroyDevice)
	OURS(DestroyInstance)
	OURS(CreateShaderModule)
	OURS(CreateComputePipelines)
#undef OURS
	return NULL;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkGetDeviceProcAddr(VkDevice d, const char *name);

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkGetInstanceProcAddr(VkInstance inst, const char *name) {
	if (!strcmp(name, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)vkGetInstanceProcAddr;
	if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)vkGetDeviceProcAddr;
	if (!strcmp(name, "vkCreateInstance")) return (PFN_vkVoidFunction)CreateInstance;
	PFN_vkVoidFunction f = ours(name);
	if (f) return f;
	PFN_vkGetInstanceProcAddr next = instGIPA(inst);
	return next ? next(inst, name) : NULL;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkGetDeviceProcAddr(VkDevice d, const char *name) {
	if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)vkGetDeviceProcAddr;
	PFN_vkVoidFunction f = ours(name);
	if (f && strcmp(name, "vkCreateDevice") && strcmp(name, "vkDestroyInstance")) return f;
	return devProc(d, name);
}
