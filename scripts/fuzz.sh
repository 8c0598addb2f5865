#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded number of executions
# each (default 20000; `make fuzz FUZZEXECS=500000` for a longer run).
#
# The budget is a count, not a duration: with a duration (-fuzztime=3s),
# go1.26's fuzz coordinator can report its own end-of-time deadline as a
# failure, "context deadline exceeded" with no crasher written, on a loaded
# machine (golang/go#75804, fixed in go1.27). CI hit it. A count has no
# deadline to race.
#
# Minimizing each new input is bounded by a count too: with the default
# (60 s) a short run spends its whole budget minimizing and stops exploring.
set -euo pipefail
n=${1:-20000}
case $n in
  ''|*[!0-9]*) echo "fuzz.sh: the budget is a count of executions, got '$n'" >&2; exit 2;;
esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for name in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    start=$SECONDS
    go test -run='^$' -fuzz="^${name}\$" -fuzztime="${n}x" -fuzzminimizetime=200x "$pkg" >"$log" 2>&1 || { cat "$log"; exit 1; }
    echo "fuzz: $pkg $name: ${n} execs, $((SECONDS - start)) s"
  done
done
