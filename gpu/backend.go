package gpu

import (
	"fmt"
	"strings"

	"github.com/cogentcore/webgpu/wgpu"
)

// Backend is the native graphics API that wgpu drives.
type Backend int

const (
	BackendAuto Backend = iota // best available: Vulkan, Metal or DX12 before GL
	BackendVulkan
	BackendMetal
	BackendDX12
	BackendGL
)

var backendNames = [...]string{"auto", "vulkan", "metal", "dx12", "gl"}

func (b Backend) String() string {
	if b >= 0 && int(b) < len(backendNames) {
		return backendNames[b]
	}
	return fmt.Sprintf("Backend(%d)", int(b))
}

// ParseBackend parses the value of --gpu-backend.
func ParseBackend(s string) (Backend, error) {
	for i, n := range backendNames {
		if strings.EqualFold(s, n) {
			return Backend(i), nil
		}
	}
	return 0, fmt.Errorf("gpu: unknown backend %q (want one of %s)", s, strings.Join(backendNames[:], ", "))
}

// Set and Type let a Backend be a pflag.Value.
func (b *Backend) Set(s string) error {
	v, err := ParseBackend(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

func (b *Backend) Type() string { return "backend" }

func (b Backend) instanceFlags() wgpu.InstanceBackend {
	switch b {
	case BackendVulkan:
		return wgpu.InstanceBackendVulkan
	case BackendMetal:
		return wgpu.InstanceBackendMetal
	case BackendDX12:
		return wgpu.InstanceBackendDX12
	case BackendGL:
		return wgpu.InstanceBackendGL
	default:
		return wgpu.InstanceBackendPrimary | wgpu.InstanceBackendGL
	}
}

func backendOf(t wgpu.BackendType) Backend {
	switch t {
	case wgpu.BackendTypeVulkan:
		return BackendVulkan
	case wgpu.BackendTypeMetal:
		return BackendMetal
	case wgpu.BackendTypeD3D12:
		return BackendDX12
	case wgpu.BackendTypeOpenGL, wgpu.BackendTypeOpenGLES:
		return BackendGL
	}
	return BackendAuto
}

// newInstance creates a wgpu instance. An explicit backend gets an instance
// of that backend alone, made by shim.c: the binding's CreateInstance with a
// descriptor leaves fields of the native extras struct uninitialized, and
// wgpu-native aborts on the garbage. BackendAuto gets every backend, GL
// included, and then each instance initializes EGL even where Vulkan is
// chosen; wgpu's GL backend aborts the process (egl.rs "BadContext") when
// two goroutines create and enumerate instances at once, so callers that
// may open devices concurrently should name their backend.
func newInstance(b Backend) *wgpu.Instance {
	if b != BackendAuto {
		if inst := createInstance(b.instanceFlags()); inst != nil {
			return inst
		}
	}
	return wgpu.CreateInstance(nil)
}
