package tiers

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/rdrr/peer/gpu"
)

// GPUArena is the VRAM level: equal slots in GPU buffers, the layout
// gpu/ops.Kernels.Q4KMatVecGroup reads weights from (slot i of a buffer at
// byte i x SlotSize). One buffer is one storage binding, which devices
// bound (2 GiB at most through wgpu), so a large arena is several buffers.
type GPUArena struct {
	d        *gpu.Device
	bufs     []*gpu.Buffer
	perBuf   int
	slots    int
	slotSize int64
}

// NewGPUArena allocates room for slots slots of slotSize bytes (a multiple
// of 4) in buffers as large as the device binds. It gives fewer slots if
// the device runs out of memory: the budget degrades to what the device
// gives, with a warning, never a crash.
func NewGPUArena(d *gpu.Device, slotSize int64, slots int, log *slog.Logger) (*GPUArena, error) {
	if slotSize <= 0 || slotSize%4 != 0 || slots <= 0 {
		return nil, fmt.Errorf("tiers: arena of %d slots of %d bytes (want > 0, slots a multiple of 4 bytes)", slots, slotSize)
	}
	perBuf := SlotsPerBuffer(d, slotSize)
	if perBuf == 0 {
		lim := d.Info().Limits
		return nil, fmt.Errorf("tiers: the device cannot hold one slot of %d bytes in a buffer (max %d)", slotSize, min(lim.MaxBufferSize, lim.MaxStorageBufferBindingSize))
	}
	if info := d.Info(); info.Type == "cpu" {
		// A CPU adapter (lavapipe) allocates lazily and would fail only
		// when the memory is touched: bound it by the machine's memory.
		if max := int64(ramShare/4*float64(memTotal())) / slotSize; max > 0 && int64(slots) > max {
			if log != nil {
				log.Warn("tiers: the VRAM budget is more than this CPU adapter's machine has; using less", "asked_slots", slots, "slots", max)
			}
			slots = int(max)
		}
	}
	a := &GPUArena{d: d, perBuf: perBuf, slotSize: slotSize}
	for a.slots < slots {
		n := min(perBuf, slots-a.slots)
		buf, err := d.Alloc(uint64(n) * uint64(slotSize))
		if err != nil {
			if log != nil {
				log.Warn("tiers: the device holds fewer VRAM slots than the budget asks; using what it gave", "asked_slots", slots, "slots", a.slots, "err", err)
			}
			break
		}
		a.bufs = append(a.bufs, buf)
		a.slots += n
	}
	if a.slots == 0 {
		return nil, fmt.Errorf("tiers: the device cannot hold one slot of %d bytes", slotSize)
	}
	return a, nil
}

// SlotsPerBuffer is how many slots of slotSize (> 0) bytes one arena
// buffer of d holds: a buffer as large as the device makes and binds.
func SlotsPerBuffer(d *gpu.Device, slotSize int64) int {
	lim := d.Info().Limits
	return int(min(lim.MaxBufferSize, lim.MaxStorageBufferBindingSize) / uint64(slotSize))
}

// BankSlots is the slots of one buffer: a kernel binds one buffer, so
// matrices that one dispatch reads must lie in one bank (BankedArena).
func (a *GPUArena) BankSlots() int { return a.perBuf }

func (a *GPUArena) Slots() int      { return a.slots }
func (a *GPUArena) SlotSize() int64 { return a.slotSize }

// Locate returns the buffer that holds slot and the slot's index in it.
func (a *GPUArena) Locate(slot int) (*gpu.Buffer, int) {
	return a.bufs[slot/a.perBuf], slot % a.perBuf
}

// Upload copies data into slot through the device's staging ring.
func (a *GPUArena) Upload(ctx context.Context, slot int, data []byte) error {
	if slot < 0 || slot >= a.slots || int64(len(data)) > a.slotSize {
		return fmt.Errorf("tiers: upload of %d bytes to slot %d of %d x %d", len(data), slot, a.slots, a.slotSize)
	}
	buf, i := a.Locate(slot)
	return a.d.Upload(ctx, buf.Sub(uint64(i)*uint64(a.slotSize), uint64(a.slotSize)), data)
}

// AllocHost returns n bytes of host memory the arena copies from directly
// (a gpu.HostBuffer): the RAM level's entries with Config.HostRAM.
func (a *GPUArena) AllocHost(n int64) (HostBlock, error) {
	if n <= 0 || n > a.slotSize {
		return nil, fmt.Errorf("tiers: host block of %d bytes for slots of %d", n, a.slotSize)
	}
	h, err := a.d.AllocHost(uint64(n))
	if err != nil {
		return nil, err // not a nil *gpu.HostBuffer in an interface
	}
	return h, nil
}

// UploadHost copies a sealed host block (from AllocHost) into slot: one
// copy on the GPU's queue, no memcpy.
func (a *GPUArena) UploadHost(ctx context.Context, slot int, b HostBlock) error {
	h, ok := b.(*gpu.HostBuffer)
	if !ok || slot < 0 || slot >= a.slots || int64(h.Len()) > a.slotSize {
		return fmt.Errorf("tiers: host upload of %T to slot %d of %d x %d", b, slot, a.slots, a.slotSize)
	}
	buf, i := a.Locate(slot)
	return a.d.CopyHost(ctx, buf.Sub(uint64(i)*uint64(a.slotSize), uint64(a.slotSize)), h, 0, uint64(h.Len()))
}

// Release frees the arena's buffers.
func (a *GPUArena) Release() {
	for _, b := range a.bufs {
		b.Release()
	}
}
