//go:build linux

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
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

typedef int32_t (*pfnCreateInstance)(const vkInstanceInfo *, const void *, void **);
typedef void (*pfnDestroyInstance)(void *, const void *);
typedef int32_t (*pfnEnumerate)(void *, uint32_t *, void **);
typedef void (*pfnProperties)(void *, void *);
typedef void (*pfnMemory)(void *, vkMemoryProperties *);

// vkLocalHeap returns the size of the largest device-local memory heap of
// the physical device with this vendor and device id, and its device type
// in *type (VkPhysicalDeviceType); 0 if the Vulkan loader, an instance or
// the device is missing. It makes an instance of its own and destroys it.
static uint64_t vkLocalHeap(uint32_t vendor, uint32_t device, uint32_t *type) {
	void *lib = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		return 0;
	}
	pfnCreateInstance create = (pfnCreateInstance)dlsym(lib, "vkCreateInstance");
	pfnDestroyInstance destroy = (pfnDestroyInstance)dlsym(lib, "vkDestroyInstance");
	pfnEnumerate enumerate = (pfnEnumerate)dlsym(lib, "vkEnumeratePhysicalDevices");
	pfnProperties props = (pfnProperties)dlsym(lib, "vkGetPhysicalDeviceProperties");
	pfnMemory memory = (pfnMemory)dlsym(lib, "vkGetPhysicalDeviceMemoryProperties");
	uint64_t best = 0;
	if (create && destroy && enumerate && props && memory) {
		vkAppInfo app = {0, NULL, "rdrr-peer", 0, "rdrr-peer", 0, (1u << 22)}; // Vulkan 1.0
		vkInstanceInfo info = {1, NULL, 0, &app, 0, NULL, 0, NULL};
		void *inst = NULL;
		if (create(&info, NULL, &inst) == 0 && inst) {
			void *devs[16];
			uint32_t n = 16;
			int32_t r = enumerate(inst, &n, devs);
			if (r >= 0) { // VK_SUCCESS or VK_INCOMPLETE
				for (uint32_t i = 0; i < n && i < 16; i++) {
					// VkPhysicalDeviceProperties starts apiVersion,
					// driverVersion, vendorID, deviceID, deviceType (all
					// 32-bit); the whole struct is under 1 KB, and has
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
					for (uint32_t h = 0; h < mp.memoryHeapCount && h < 16; h++) {
						if ((mp.memoryHeaps[h].flags & 1) && mp.memoryHeaps[h].size > best) {
							best = mp.memoryHeaps[h].size;
							*type = p[4];
						}
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
// not tell), and whether that device is a CPU (VK_PHYSICAL_DEVICE_TYPE_CPU).
func localMemory(vendor, device uint32) (bytes uint64, cpu bool) {
	var typ C.uint32_t
	n := C.vkLocalHeap(C.uint32_t(vendor), C.uint32_t(device), &typ)
	return uint64(n), typ == 4
}
