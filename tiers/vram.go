package tiers

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/rdrr/peer/gpu"
)

// GPUArena is the VRAM level: one GPU buffer of equal slots, the layout
// gpu.Kernels.Q4KMatVecGroup reads expert weights from (slot s at byte
// s x SlotSize).
type GPUArena struct {
	d        *gpu.Device
	buf      *gpu.Buffer
	slots    int
	slotSize int64
}

// NewGPUArena allocates room for slots slots of slotSize bytes (a multiple
// of 4), fewer if the device cannot hold that many in one buffer: the
// budget degrades to what the device gives, with a warning, never a crash.
func NewGPUArena(d *gpu.Device, slotSize int64, slots int, log *slog.Logger) (*GPUArena, error) {
	if slotSize <= 0 || slotSize%4 != 0 || slots <= 0 {
		return nil, fmt.Errorf("tiers: arena of %d slots of %d bytes (want > 0, slots a multiple of 4 bytes)", slots, slotSize)
	}
	if max := int64(d.Info().Limits.MaxBufferSize) / slotSize; int64(slots) > max {
		if log != nil {
			log.Warn("tiers: the VRAM budget is more than one device buffer holds; using less", "asked_slots", slots, "slots", max, "max_buffer", d.Info().Limits.MaxBufferSize)
		}
		slots = int(max)
	}
	for slots > 0 {
		buf, err := d.Alloc(uint64(slots) * uint64(slotSize))
		if err == nil {
			return &GPUArena{d: d, buf: buf, slots: slots, slotSize: slotSize}, nil
		}
		if log != nil {
			log.Warn("tiers: cannot allocate the VRAM arena; trying half", "slots", slots, "err", err)
		}
		slots /= 2
	}
	return nil, fmt.Errorf("tiers: the device cannot hold one slot of %d bytes", slotSize)
}

func (a *GPUArena) Slots() int      { return a.slots }
func (a *GPUArena) SlotSize() int64 { return a.slotSize }

// Buffer returns the arena's buffer (the kernels' weights argument).
func (a *GPUArena) Buffer() *gpu.Buffer { return a.buf }

// Upload copies data into slot through the device's staging ring.
func (a *GPUArena) Upload(ctx context.Context, slot int, data []byte) error {
	if slot < 0 || slot >= a.slots || int64(len(data)) > a.slotSize {
		return fmt.Errorf("tiers: upload of %d bytes to slot %d of %d x %d", len(data), slot, a.slots, a.slotSize)
	}
	return a.d.Upload(ctx, a.buf.Sub(uint64(slot)*uint64(a.slotSize), uint64(a.slotSize)), data)
}

// Release frees the arena's buffer.
func (a *GPUArena) Release() { a.buf.Release() }
