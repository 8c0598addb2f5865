#!/usr/bin/env bash
# Builds the browser peer (swarm/browser/app) to WebAssembly, with Go's
# wasm_exec.js, into swarm/browser/static/files, where `peer` embeds them
# to serve at /app/. A peer built before this ran (`go install`) serves a
# page that says the browser peer is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=swarm/browser/static/files
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
GOOS=js GOARCH=wasm go build -trimpath -ldflags="-s -w" -o "$tmp/peer.wasm" ./swarm/browser/app
root=$(go env GOROOT)
js="$root/lib/wasm/wasm_exec.js"
[ -f "$js" ] || js="$root/misc/wasm/wasm_exec.js"
cp "$js" "$tmp/wasm_exec.js"
# Replace only what changed, so that builds that embed them are not redone.
for f in peer.wasm wasm_exec.js; do
  cmp -s "$tmp/$f" "$out/$f" 2>/dev/null || cp "$tmp/$f" "$out/$f"
done
