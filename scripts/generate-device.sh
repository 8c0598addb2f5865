#!/usr/bin/env bash
# Runs `peer generate --engine gpu` on the lent accelerator machine with
# synthetic models regenerated there (--procedural: nothing stored):
#   device tool: carry ["bin", ".gl"], command: bash scripts/generate-device.sh
# .gl holds the Vulkan loader and glvnd debs (see gpu/bench-device.sh).
# PRESETS, VRAMS, TOKENS and PROMPT choose the runs; GEN_ARGS adds flags
# (e.g. --json). Each run leaves its trace and a Go CPU profile in $OUT.
# bin/peer for it: go build -tags nobrowser -trimpath -ldflags='-s -w' -o bin/peer ./cmd/peer
# (without the browser peer's WebAssembly: a carry holds 64 MiB in all).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
. "$(dirname "$0")/device-env.sh"
peer=${PEER:-$PWD/bin/peer}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/machine.txt"
nproc | tee -a "$out/machine.txt"
for preset in ${PRESETS:-tiny-moe mixtral-8x7b}; do
  /usr/bin/time -f "synth $preset: %e s, %M KB" $peer synth -q --preset $preset --procedural -o /tmp/$preset 2>&1 | tail -1 | tee -a "$out/generate.txt"
  for vram in ${VRAMS:-2GiB}; do
    echo "== $preset, --vram $vram" | tee -a "$out/generate.txt"
    $peer --home /tmp/h-$preset generate - --procedural /tmp/$preset/manifest.json --engine gpu --vram $vram --ram 100GiB \
      --prompt "${PROMPT:-The swarm is}" --max-tokens ${TOKENS:-16} --trace "$out/$preset-$vram.trace" \
      --cpuprofile "$out/$preset-$vram.pprof" --log-level warn ${GEN_ARGS:-} 2>&1 \
      | grep -v '^\[wgpu\]' | tee -a "$out/generate.txt"
  done
done
