package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"tib", 1 << 40}, {"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10},
	{"tb", 1e12}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3},
	{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}, {"b", 1},
}

// parseBytes parses sizes like 1048576, 64MiB, 1.5GB, 200g.
func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	// NaN fails both comparisons; infinities and sizes past int64 fail
	// the second (converting them is CPU-dependent).
	if err != nil || !(f >= 0) || !(f*float64(mult) < 1<<63) {
		return 0, fmt.Errorf("bad size %q (want e.g. 500MiB, 2GB, 1048576)", s)
	}
	return int64(f * float64(mult)), nil
}

// formatBytes prints n with a binary unit.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// progress prints a one-line progress report to w, at most every 200 ms.
type progress struct {
	w     io.Writer
	label string
	off   bool
	start time.Time
	last  time.Time
	shown bool
}

func newProgress(w io.Writer, label string, off bool) *progress {
	return &progress{w: w, label: label, off: off, start: time.Now()}
}

func (p *progress) update(done, total int64) {
	// Nothing for work that ends within half a second.
	if p.off || time.Since(p.last) < 200*time.Millisecond || time.Since(p.start) < 500*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.shown = true
	rate := float64(done) / time.Since(p.start).Seconds()
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	fmt.Fprintf(p.w, "\r%s: %s / %s (%.0f%%) %s/s   ", p.label, formatBytes(done), formatBytes(total), pct, formatBytes(int64(rate)))
}

func (p *progress) done() {
	if p.shown {
		fmt.Fprintln(p.w)
	}
}
