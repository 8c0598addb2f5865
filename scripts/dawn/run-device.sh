#!/usr/bin/env bash
# Runs q4kprobe on the lent machine (see README.md): .gl/dawn/ holds
# q4kprobe and libwebgpu_wrapper.so.gz (git-ignored, carried), the
# Vulkan loader's debs are .gl's own (scripts/device-env.sh).
#   device tool: carry [".gl"], command: bash scripts/dawn/run-device.sh
# SHAPES: "ROWS COLS RT SPR WG" entries separated by ';'.
set -uo pipefail
. scripts/device-env.sh
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/dawn
cp .gl/dawn/q4kprobe /tmp/dawn/ && chmod +x /tmp/dawn/q4kprobe
gunzip -c .gl/dawn/libwebgpu_wrapper.so.gz > /tmp/dawn/libwebgpu_wrapper.so
IFS=';' read -ra shapes <<< "${SHAPES:-6144 4096 4 2 128;4096 4096 4 4 128;32000 4096 4 2 128;14336 4096 4 2 128;4096 14336 8 4 128;4096 14336 4 4 128;14336 4096 8 2 128}"
for s in "${shapes[@]}"; do
  /tmp/dawn/q4kprobe scripts/dawn/q4k_dp4a.wgsl $s 2>&1 | grep -v -E "^Warning|While init|PhysicalDevice|^$" | tee -a "$out/dawn.txt"
done
