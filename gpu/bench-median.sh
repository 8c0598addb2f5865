#!/bin/sh
# Reads `go test -bench` output with several runs of each benchmark
# (-count N, or the logs of N runs concatenated) on stdin and prints, for
# every benchmark and metric, the median over the runs, the lowest and
# highest value and the number of runs:
#
#   ../.gl/gpu.test -test.run '^$' -test.bench . -test.count 5 | sh bench-median.sh
#
# The targets in BENCHMARKS.md are medians: the best run of several says
# what the hardware can do once, not what a user gets. An even number of
# runs gives the mean of the middle two. POSIX sh, sort and awk only: the
# device machine has no Go toolchain.
set -eu
awk '
/^Benchmark/ {
  name = $1
  sub(/-[0-9]+$/, "", name) # the GOMAXPROCS suffix
  for (i = 3; i + 1 <= NF; i += 2) {
    if ($i ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) print name, $(i + 1), $i
  }
}' | sort -k1,1 -k2,2 -k3,3g | awk '
function flush() {
  if (n == 0) return
  if (n % 2) med = v[(n + 1) / 2]
  else med = (v[n / 2] + v[n / 2 + 1]) / 2
  printf "%-60s %-18s median %12.4g  min %12.4g  max %12.4g  runs %d\n", key_name, key_unit, med, v[1], v[n], n
  n = 0
}
{
  if ($1 != key_name || $2 != key_unit) { flush(); key_name = $1; key_unit = $2 }
  v[++n] = $3
}
END { flush() }'
