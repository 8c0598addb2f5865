package kernels

import (
	"fmt"
	"strings"

	"github.com/rdrr/peer/gpu"
)

// DeviceClass names a kind of device from its adapter: kernels are
// endorsed for a class, since a variant faster on one GPU can be slower on
// another, and on one driver than on the next.
type DeviceClass struct {
	Backend, Vendor, Device, Driver string
}

// ClassOf returns the class of an adapter: the backend, the PCI vendor
// and device IDs (4 hex digits) and the driver string. The device ID is
// the family in the coarse class: adapters report no architecture that
// is reliable across backends, and one device ID is one chip.
func ClassOf(info gpu.AdapterInfo) DeviceClass {
	return DeviceClass{Backend: info.Backend.String(), Vendor: fmt.Sprintf("%04x", info.VendorID),
		Device: fmt.Sprintf("%04x", info.DeviceID), Driver: info.Driver}
}

// Exact is the class with the driver, "backend/vendor/device/driver" (for
// example "vulkan/10de/2330/580.95.05"): what endorsements are checked
// against.
func (c DeviceClass) Exact() string { return c.Coarse() + "/" + clean(c.Driver) }

// Coarse is the class without the driver, "backend/vendor/device": the
// gossip topic's name.
func (c DeviceClass) Coarse() string {
	return clean(c.Backend) + "/" + clean(c.Vendor) + "/" + clean(c.Device)
}

// String is the exact class.
func (c DeviceClass) String() string { return c.Exact() }

// clean maps a class part to at most 48 characters of [a-z0-9._-]: lower
// case, spaces as '-', other characters dropped; "unknown" if nothing is
// left. Every part then matches what Decode accepts.
func clean(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if b.Len() >= 48 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	if b.Len() == 0 {
		return "unknown"
	}
	return b.String()
}
