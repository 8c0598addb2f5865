package kernels

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/rdrr/peer/gpu"
)

// DeviceClass names a kind of device from its adapter: kernels are
// endorsed for a class, since a variant faster on one GPU can be slower on
// another.
type DeviceClass struct {
	Backend, Vendor, Device, Driver string
}

// ClassOf returns the class of an adapter.
func ClassOf(info gpu.AdapterInfo) DeviceClass {
	return DeviceClass{Backend: info.Backend.String(), Vendor: fmt.Sprintf("%04x", info.VendorID),
		Device: fmt.Sprintf("%04x", info.DeviceID), Driver: info.Driver}
}

// Exact is the class with the driver: what endorsements are checked
// against.
func (c DeviceClass) Exact() string {
	return clean(c.Backend) + "/" + clean(c.Vendor) + "/" + clean(c.Device) + "/" + clean(c.Driver)
}

// Coarse is the class without the driver: the gossip topic's name.
func (c DeviceClass) Coarse() string {
	return clean(c.Backend) + "/" + clean(c.Vendor) + "/" + clean(c.Device)
}

// clean keeps a class name's parts to [a-z0-9.-_], bounded.
func clean(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
		if b.Len() >= 48 {
			break
		}
	}
	if b.Len() == 0 {
		return "unknown"
	}
	return b.String()
}

// ShapeBucket names the bucket of a shape: each dimension rounded up to a
// power of two, so a kernel endorsed for 4096x14336 also covers 4000x14000.
func ShapeBucket(dims ...int) string {
	parts := make([]string, len(dims))
	for i, d := range dims {
		if d <= 1 {
			parts[i] = "1"
			continue
		}
		parts[i] = fmt.Sprint(1 << bits.Len(uint(d-1)))
	}
	return strings.Join(parts, "x")
}
