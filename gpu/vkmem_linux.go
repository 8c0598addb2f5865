//go:build linux

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The few Vulkan 1.0 declarations vkLocalHeap needs (this machine has no
// Vulkan headers; the layouts are the specification's, on LP64).
typedef struct {
	int32_t sType; // VK_STRUCTURE_TYPE_APPLICATION_INFO: 0
	const void *pNext;
	const char *pApplicationName;
	uint32_t applicationVersion;
	const char *pEngineName;
	uint32_t engineVersion;
	uint32_t apiVersion;
} vkAppInfo;

typedef struct {
	int32_t sType; // VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO: 1
	const void *pNext;
	uint32_t flags;
	const vkAppInfo *pApplicationInfo;
	uint32_t enabledLayerCount;
	const char *const *ppEnabledLayerNames;
	uint32_t enabledExtensionCount;
	const char *const *ppEnabledExtensionNames;
} vkInstanceInfo;

typedef struct {
	uint32_t propertyFlags;
	uint32_t heapIndex;
} vkMemoryType;

typedef struct {
	uint64_t size;
	uint32_t flags; // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT: 1
} vkMemoryHeap;

typedef struct {
	uint32_t memoryTypeCount;
	vkMemoryType memoryTypes[32];
	uint32_t memoryHeapCount;
	vkMemoryHeap memoryHeaps[16];
} vkMemoryProperties;

typedef struct {
	int32_t sType; // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2: 1000059006
	void *pNext;
	vkMemoryProperties memoryProperties;
} vkMemoryProperties2;

typedef struct {
	int32_t sType; // VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT: 1000237000
	void *pNext;
	uint64_t heapBudget[16];
	uint64_t heapUsage[16];
} vkMemoryBudget;

typedef struct {
	char extensionName[256];
	uint32_t specVersion;
} vkExtension;

typedef int32_t (*pfnCreateInstance)(const vkInstanceInfo *, const void *, void **);
typedef void (*pfnDestroyInstance)(void *, const void *);
typedef int32_t (*pfnEnumerate)(void *, uint32_t *, void **);
typedef void (*pfnProperties)(void *, void *);
typedef void (*pfnMemory)(void *, vkMemoryProperties *);
typedef void (*pfnMemory2)(void *, vkMemoryProperties2 *);
typedef int32_t (*pfnExtensions)(void *, const char *, uint32_t *, vkExtension *);

// hasExtension reports whether physical device dev offers extension name.
static int hasExtension(pfnExtensions list, void *dev, const char *name) {
	uint32_t n = 0;
	if (!list || list(dev, NULL, &n, NULL) < 0 || n == 0 || n > 4096) {
		return 0;
	}
	vkExtension *ext = calloc(n, sizeof *ext);
	if (!ext) {
		return 0;
	}
	int found = 0;
	if (list(dev, NULL, &n, ext) >= 0) { // VK_SUCCESS or VK_INCOMPLETE
		for (uint32_t i = 0; i < n && !found; i++) {
			found = strncmp(ext[i].extensionName, name, sizeof ext[i].extensionName) == 0;
		}
	}
	free(ext);
	return found;
}

// vkLocalHeap returns the size of the largest device-local memory heap of
// the physical device with this vendor and device id and, where it offers
// VK_EXT_memory_budget, in *budget what this process can still allocate
// from that heap (else 0); 0 if the Vulkan loader, an instance or the
// device is missing. It makes an instance of its own and destroys it.
static uint64_t vkLocalHeap(uint32_t vendor, uint32_t device, uint64_t *budget) {
	*budget = 0;
	void *lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		return 0;
	}
	pfnCreateInstance create = (pfnCreateInstance)dlsym(lib, "vkCreateInstance");
	pfnDestroyInstance destroy = (pfnDestroyInstance)dlsym(lib, "vkDestroyInstance");
	pfnEnumerate enumerate = (pfnEnumerate)dlsym(lib, "vkEnumeratePhysicalDevices");
	pfnProperties props = (pfnProperties)dlsym(lib, "vkGetPhysicalDeviceProperties");
	pfnMemory memory = (pfnMemory)dlsym(lib, "vkGetPhysicalDeviceMemoryProperties");
	pfnMemory2 memory2 = (pfnMemory2)dlsym(lib, "vkGetPhysicalDeviceMemoryProperties2");
	pfnExtensions extensions = (pfnExtensions)dlsym(lib, "vkEnumerateDeviceExtensionProperties");
	uint64_t best = 0;
	if (create && destroy && enumerate && props && memory) {
		// Vulkan 1.1 for the memory budget, else 1.0 (a 1.0 loader
		// refuses 1.1).
		const uint32_t v11 = (1u << 22) | (1u << 12), v10 = 1u << 22;
		vkAppInfo app = {0, NULL, "rdrr-peer", 0, "rdrr-peer", 0, v11};
		vkInstanceInfo info = {1, NULL, 0, &app, 0, NULL, 0, NULL};
		void *inst = NULL;
		if (create(&info, NULL, &inst) != 0 || !inst) {
			app.apiVersion = v10;
			inst = NULL;
			if (create(&info, NULL, &inst) != 0) {
				inst = NULL;
			}
		}
		if (inst) {
			void *devs[16];
			uint32_t n = 16;
			int32_t r = enumerate(inst, &n, devs);
			if (r >= 0) { // VK_SUCCESS or VK_INCOMPLETE
				for (uint32_t i = 0; i < n && i < 16; i++) {
					// VkPhysicalDeviceProperties starts apiVersion,
					// driverVersion, vendorID, deviceID (all 32-bit); the whole struct is under 1 KB, and has
					// 64-bit fields (so the buffer is 64-bit aligned).
					uint64_t buf[512];
					memset(buf, 0, sizeof buf);
					props(devs[i], buf);
					const uint32_t *p = (const uint32_t *)buf;
					if (p[2] != vendor || p[3] != device) {
						continue;
					}
					vkMemoryProperties mp;
					memset(&mp, 0, sizeof mp);
					memory(devs[i], &mp);
					int heap = -1;
					for (uint32_t h = 0; h < mp.memoryHeapCount && h < 16; h++) {
						if ((mp.memoryHeaps[h].flags & 1) && mp.memoryHeaps[h].size > best) {
							best = mp.memoryHeaps[h].size;
							heap = (int)h;
						}
					}
					if (heap >= 0 && memory2 && app.apiVersion == v11 && p[0] >= v11 && hasExtension(extensions, devs[i], "VK_EXT_memory_budget")) {
						vkMemoryBudget mb;
						memset(&mb, 0, sizeof mb);
						mb.sType = 1000237000;
						vkMemoryProperties2 mp2;
						memset(&mp2, 0, sizeof mp2);
						mp2.sType = 1000059006;
						mp2.pNext = &mb;
						memory2(devs[i], &mp2);
						*budget = mb.heapBudget[heap];
					}
					break;
				}
			}
			destroy(inst, NULL);
		}
	}
	dlclose(lib);
	return best;
}
*/
import "C"

// localMemory asks the Vulkan loader for the largest device-local heap
// of the physical device with this vendor and device id (what WebGPU does
// not tell): its size, and what this process can still allocate from it
// where the driver says (VK_EXT_memory_budget; else 0).
func localMemory(vendor, device uint32) (size, budget uint64) {
	var b C.uint64_t
	n := C.vkLocalHeap(C.uint32_t(vendor), C.uint32_t(device), &b)
	return uint64(n), uint64(b)
}
