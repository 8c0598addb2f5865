//go:build !linux

package gpu

// localMemory is known only through the Vulkan loader on Linux.
func localMemory(vendor, device uint32) (uint64, bool) { return 0, false }
