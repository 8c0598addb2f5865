package tiers

import (
	"log/slog"
	"testing"
)

func TestClampDegrades(t *testing.T) {
	if memTotal() == 0 {
		t.Skip("no /proc/meminfo")
	}
	b := Clamp(Budgets{RAM: 1 << 60, Disk: 1 << 60}, t.TempDir(), 0, slog.New(slog.DiscardHandler))
	if b.RAM >= 1<<60 || b.RAM <= 0 || b.Disk >= 1<<60 || b.Disk <= 0 {
		t.Fatalf("clamped to %+v", b)
	}
	small := Budgets{RAM: 1 << 20, Disk: 1 << 20}
	if got := Clamp(small, t.TempDir(), 0, slog.New(slog.DiscardHandler)); got != small {
		t.Fatalf("a budget the machine has was changed: %+v", got)
	}
}
