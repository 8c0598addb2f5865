#!/usr/bin/env bash
# Runs every Go benchmark of the module, package by package. Each benchmark
# reports its speed as a ratio of a limit measured in the same run (raw
# BLAKE3, TCP loopback, GPU copy bandwidth), because shared machines are noisy.
#   BENCH=regexp    which benchmarks (default all)
#   PKGS="./cas/"   which packages (default every package with benchmarks)
#   BENCHTIME=1x    go test -benchtime
set -euo pipefail
bench=${BENCH:-.}
benchtime=${BENCHTIME:-1x}
pkgs=${PKGS:-$(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./... )}
for pkg in $pkgs; do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  grep -qs '^func Benchmark' "$dir"/*_test.go || continue
  echo "== $pkg"
  go test -run='^$' -bench="$bench" -benchtime="$benchtime" -benchmem=false -timeout 30m "$pkg"
done
