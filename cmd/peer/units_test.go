package main

import "testing"

// Sizes and rates come from flags, config.toml and the environment: what
// is not a size in int64's range is refused, whatever the CPU would make
// of converting it.
func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1048576", 1 << 20}, {"64MiB", 64 << 20}, {"1.5GB", 1500000000}, {"200g", 200 << 30},
		{" 16 KiB ", 16 << 10}, {"0", 0}, {"7EiB", -1}, {"8191PiB", -1},
		{"1e30", -1}, {"inf", -1}, {"+Inf", -1}, {"nan", -1}, {"-1", -1}, {"-0.5k", -1}, {"", -1}, {"MiB", -1},
		{"9223372036854775807", -1}, {"8e18", 8e18}, {"8388608TiB", -1}, {"8388607TiB", 8388607 << 40},
	} {
		got, err := parseBytes(tc.in)
		if tc.want < 0 {
			if err == nil {
				t.Errorf("parseBytes(%q) = %d; want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}
