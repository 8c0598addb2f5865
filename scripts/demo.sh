#!/usr/bin/env bash
# make demo: everything that works so far, on an embedded default, in a
# throw-away home under /tmp. Talks only to loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
peer=$PWD/bin/peer
work=$(mktemp -d /tmp/rdrr-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
export RDRR_HOME=$work/home
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "init a peer home and identity"
$peer init
