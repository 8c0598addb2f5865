package tiers

import (
	"bufio"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/rdrr/peer/cas"
	"golang.org/x/sys/unix"
)

// Budgets are the bytes each level may hold.
type Budgets struct {
	VRAM int64 `json:"vram"`
	RAM  int64 `json:"ram"`
	Disk int64 `json:"disk"`
}

// ramShare is the most of the machine's memory the RAM level takes.
const ramShare = 0.8

// Clamp lowers budgets the machine cannot give, with a warning each: RAM
// to 80% of the memory the machine has, disk to the free space of the
// store's file system plus what the store already holds. (The VRAM budget
// is clamped by NewGPUArena, which knows the device.)
func Clamp(b Budgets, storeDir string, storeBytes int64, log *slog.Logger) Budgets {
	if total := memTotal(); total > 0 && float64(b.RAM) > ramShare*float64(total) {
		log.Warn("tiers: the RAM budget is more than this machine has; using 80% of its memory", "asked", b.RAM, "memory", total)
		b.RAM = int64(ramShare * float64(total))
	}
	if storeDir != "" {
		var fs unix.Statfs_t
		if unix.Statfs(storeDir, &fs) == nil {
			avail := int64(fs.Bavail)*int64(fs.Bsize) + storeBytes
			if b.Disk > avail {
				log.Warn("tiers: the disk budget is more than the file system has free; using what it has", "asked", b.Disk, "available", avail)
				b.Disk = avail
			}
		}
	}
	return b
}

// MemAvailable returns MemAvailable from /proc/meminfo in bytes: what
// the machine can give without swapping (0 if unknown).
func MemAvailable() int64 { return memInfo("MemAvailable:") }

// memTotal returns MemTotal from /proc/meminfo in bytes (0 if unknown).
func memTotal() int64 { return memInfo("MemTotal:") }

// memInfo returns the /proc/meminfo line with this key in bytes (0 if
// unknown).
func memInfo(key string) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// Collect keeps the disk level under its budget: the store's
// garbage collection, least recently used first; pinned blobs (a pinned
// model's shards) are never collected.
func (d DiskSource) Collect(ctx context.Context, budget int64) (cas.GCReport, error) {
	return d.Store.GC(ctx, budget)
}
