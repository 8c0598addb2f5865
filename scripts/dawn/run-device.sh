#!/usr/bin/env bash
# Runs q4kprobe on the lent machine (see README.md): .gl/dawn/ holds
# q4kprobe, libwebgpu_wrapper.so.gz and the op library's kernels dumped
# for each shape (ours-ROWSxCOLS.wgsl and .launch; git-ignored, carried);
# the Vulkan loader's debs are .gl's own (scripts/device-env.sh).
#   device tool: carry [".gl"], command: bash scripts/dawn/run-device.sh
# SHAPES: "ROWS COLS" entries separated by ';'; LAYOUTS: the dp4a
# kernel's "RT SPR WG" entries separated by ';'.
set -uo pipefail
. scripts/device-env.sh
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/dawn
cp .gl/dawn/q4kprobe /tmp/dawn/ && chmod +x /tmp/dawn/q4kprobe
gunzip -c .gl/dawn/libwebgpu_wrapper.so.gz > /tmp/dawn/libwebgpu_wrapper.so
IFS=';' read -ra shapes <<< "${SHAPES:-6144 4096;4096 4096;32000 4096;14336 4096;4096 14336}"
IFS=';' read -ra layouts <<< "${LAYOUTS:-4 2 128;8 2 128;4 4 128;8 4 128;4 2 256}"
for s in "${shapes[@]}"; do
  set -- $s
  if [ -f ".gl/dawn/ours-$1x$2.wgsl" ]; then
    /tmp/dawn/q4kprobe -ours ".gl/dawn/ours-$1x$2" $1 $2 2>&1 | grep -v -E "^Warning|While init|PhysicalDevice|^$" | tee -a "$out/dawn.txt"
  fi
  for l in "${layouts[@]}"; do
    /tmp/dawn/q4kprobe scripts/dawn/q4k_dp4a.wgsl $1 $2 $l 2>&1 | grep -v -E "^Warning|While init|PhysicalDevice|^$" | tee -a "$out/dawn.txt"
  done
done
# The runtime's own products on wgpu-native in the same call, when
# .glb/ops.test.gz is carried (go test -c -o ops.test ./gpu/ops): their
# x-of-same-copy beside the probe's.
if [ -f .glb/ops.test.gz ]; then
  gunzip -c .glb/ops.test.gz > /tmp/dawn/ops.test && chmod +x /tmp/dawn/ops.test
  (cd gpu/ops && /tmp/dawn/ops.test -test.run '^$' -test.bench 'Q4KDecode/(copy|qkv_xq|o_xq|head_xq)/' -test.benchtime 1x 2>&1 | grep -E '^Benchmark' | tee -a "$out/dawn.txt")
fi
