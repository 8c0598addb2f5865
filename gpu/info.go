package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"github.com/cogentcore/webgpu/wgpu"
)

// AdapterInfo describes an adapter, or an open device and the limits it was
// granted. It is what `peer gpu info --json` prints and what kernels/
// derives device classes from.
type AdapterInfo struct {
	Backend      Backend  `json:"backend"`
	Type         string   `json:"type"` // discrete-gpu, integrated-gpu, cpu, unknown
	Vendor       string   `json:"vendor"`
	VendorID     uint32   `json:"vendorId"`
	Device       string   `json:"device"`
	DeviceID     uint32   `json:"deviceId"`
	Driver       string   `json:"driver"`
	Architecture string   `json:"architecture,omitempty"`
	Limits       Limits   `json:"limits"`
	Features     []string `json:"features"`
	// ShaderF16 is true when the adapter offers WebGPU's shader-f16
	// feature (the device then requests it). The WGSL compiler of
	// wgpu-native v22 (naga) cannot parse `enable f16;` all the same
	// (checked 2026-11-29 on lavapipe, which offers the feature): no
	// built-in kernel uses f16 arithmetic; f16 data is unpacked with
	// unpack2x16float.
	ShaderF16 bool `json:"shaderF16"`
	// Subgroups is always false: wgpu-native v22, which the binding links,
	// exposes no subgroup feature. The built-in kernels do not need it.
	Subgroups bool `json:"subgroups"`
	// TimestampQuery reports the timestamp-query feature, which
	// Options.Profile turns on for StartProfile (profile.go).
	TimestampQuery bool `json:"timestampQuery"`
}

// Limits are the limits that matter to compute work.
type Limits struct {
	MaxBufferSize                     uint64 `json:"maxBufferSize"`
	MaxStorageBufferBindingSize       uint64 `json:"maxStorageBufferBindingSize"`
	MaxUniformBufferBindingSize       uint64 `json:"maxUniformBufferBindingSize"`
	MaxStorageBuffersPerShaderStage   uint32 `json:"maxStorageBuffersPerShaderStage"`
	MaxComputeWorkgroupStorageSize    uint32 `json:"maxComputeWorkgroupStorageSize"`
	MaxComputeInvocationsPerWorkgroup uint32 `json:"maxComputeInvocationsPerWorkgroup"`
	MaxComputeWorkgroupSizeX          uint32 `json:"maxComputeWorkgroupSizeX"`
	MaxComputeWorkgroupsPerDimension  uint32 `json:"maxComputeWorkgroupsPerDimension"`
	MinUniformBufferOffsetAlignment   uint32 `json:"minUniformBufferOffsetAlignment"`
	MinStorageBufferOffsetAlignment   uint32 `json:"minStorageBufferOffsetAlignment"`
}

// Limits returns the limits the device was granted (see Open): what an
// op library or a benchmark sizes its bindings by.
func (d *Device) Limits() Limits { return d.limits }

func limitsOf(l wgpu.Limits) Limits {
	return Limits{
		MaxBufferSize:                     l.MaxBufferSize,
		MaxStorageBufferBindingSize:       l.MaxStorageBufferBindingSize,
		MaxUniformBufferBindingSize:       l.MaxUniformBufferBindingSize,
		MaxStorageBuffersPerShaderStage:   l.MaxStorageBuffersPerShaderStage,
		MaxComputeWorkgroupStorageSize:    l.MaxComputeWorkgroupStorageSize,
		MaxComputeInvocationsPerWorkgroup: l.MaxComputeInvocationsPerWorkgroup,
		MaxComputeWorkgroupSizeX:          l.MaxComputeWorkgroupSizeX,
		MaxComputeWorkgroupsPerDimension:  l.MaxComputeWorkgroupsPerDimension,
		MinUniformBufferOffsetAlignment:   l.MinUniformBufferOffsetAlignment,
		MinStorageBufferOffsetAlignment:   l.MinStorageBufferOffsetAlignment,
	}
}

// MarshalText makes a Backend print as its name in JSON.
func (b Backend) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText parses a backend name.
func (b *Backend) UnmarshalText(p []byte) error { return b.Set(string(p)) }

func adapterTypeName(t wgpu.AdapterType) string {
	switch t {
	case wgpu.AdapterTypeDiscreteGPU:
		return "discrete-gpu"
	case wgpu.AdapterTypeIntegratedGPU:
		return "integrated-gpu"
	case wgpu.AdapterTypeCPU:
		return "cpu"
	}
	return "unknown"
}

func describe(a *wgpu.Adapter) AdapterInfo {
	wi := a.GetInfo()
	info := AdapterInfo{
		Backend:      backendOf(wi.BackendType),
		Type:         adapterTypeName(wi.AdapterType),
		Vendor:       wi.VendorName,
		VendorID:     wi.VendorId,
		Device:       wi.Name,
		DeviceID:     wi.DeviceId,
		Driver:       wi.DriverDescription,
		Architecture: wi.Architecture,
		Limits:       limitsOf(a.GetLimits().Limits),
	}
	for _, f := range a.EnumerateFeatures() {
		info.Features = append(info.Features, f.String())
		switch f {
		case wgpu.FeatureNameShaderF16:
			info.ShaderF16 = true
		case wgpu.FeatureNameTimestampQuery:
			info.TimestampQuery = true
		}
	}
	sort.Strings(info.Features)
	return info
}

// String is a one-line summary: "vulkan discrete-gpu NVIDIA H100 (driver 580.1)".
func (a AdapterInfo) String() string {
	name := a.Device
	if name == "" || strings.HasPrefix(name, "0x") {
		name = a.Driver
	}
	return fmt.Sprintf("%s %s %s (vendor %s, driver %s)", a.Backend, a.Type, name, a.Vendor, a.Driver)
}

// rank orders adapters for BackendAuto: real GPUs before CPU ones, and
// Vulkan/Metal/DX12 before GL.
func rank(a AdapterInfo) int {
	r := 0
	switch a.Type {
	case "discrete-gpu":
		r += 30
	case "integrated-gpu":
		r += 20
	case "unknown":
		r += 10
	}
	if a.Backend != BackendGL {
		r += 5
	}
	return r
}

func (a AdapterInfo) matches(want string) bool {
	if want == "" {
		return true
	}
	w := strings.ToLower(want)
	for _, s := range []string{a.Device, a.Driver, a.Vendor, a.Architecture} {
		if strings.Contains(strings.ToLower(s), w) {
			return true
		}
	}
	return false
}

// ListAdapters returns the adapters that o.Backend offers, best first (the
// one Open would pick comes first). It opens no device.
func ListAdapters(ctx context.Context, o Options) ([]AdapterInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	inst := newInstance(o.Backend)
	defer inst.Release()
	var out []AdapterInfo
	for _, a := range inst.EnumerateAdapters(&wgpu.InstanceEnumerateAdapterOptons{Backends: o.Backend.instanceFlags()}) {
		info := describe(a)
		a.Release()
		if info.matches(o.Adapter) {
			out = append(out, info)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return rank(out[i]) > rank(out[j]) })
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: backend %s, adapter %q", ErrNoAdapter, o.Backend, o.Adapter)
	}
	return out, nil
}

// SetNativeLogLevel sets which of wgpu-native's own messages reach stderr:
// its warnings (mostly about windowing, irrelevant headless) only at
// slog.LevelDebug and below, else only its errors. The setting is
// process-wide, as wgpu-native's logger is.
func SetNativeLogLevel(l slog.Level) {
	if l <= slog.LevelDebug {
		wgpu.SetLogLevel(wgpu.LogLevelWarn)
		return
	}
	wgpu.SetLogLevel(wgpu.LogLevelError)
}
