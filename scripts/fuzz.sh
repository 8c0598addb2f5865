#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each.
# Minimizing each new input is bounded by a count: with the default (60 s)
# a short run spends its whole budget minimizing and stops exploring.
set -euo pipefail
t=${1:-10s}
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for name in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "fuzz: $pkg $name ($t)"
    go test -run='^$' -fuzz="^${name}\$" -fuzztime="$t" -fuzzminimizetime=200x "$pkg" >/tmp/rdrr-fuzz.log 2>&1 || { cat /tmp/rdrr-fuzz.log; exit 1; }
  done
done
