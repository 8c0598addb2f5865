//go:build !linux

package gpu

// localMemory is known only through the Vulkan loader on Linux.
func localMemory(vendor, device uint32) (size, budget uint64) { return 0, 0 }
