#!/usr/bin/env bash
# A/B of op-library test binaries on the lent accelerator machine,
# alternated so that every build sees the same GPU, clocks and host:
#
#   go test -c -trimpath -o /tmp/ops-a.test ./gpu/ops/     # at each build
#   gzip -c /tmp/ops-a.test > .gl/ops-a.test.gz             # (.gl travels with carry)
#   # device tool: carry [".gl"], command:
#   VARIANTS="a b" ROUNDS=3 BENCH='GPU/(copy|attention)' bash scripts/ops-ab-device.sh
#
# Each round runs every variant's `ops.test -test.run '^$' -test.bench
# $BENCH -test.benchtime 1x` once, in VARIANTS order; lines go to stdout
# and $OUT/ab.txt prefixed with the variant and the round. .gl also holds
# the Vulkan loader's and glvnd's debs (gpu/bench-device.sh says which).
# RDRR_BENCH_PROFILE=1 adds each kernel's time alone (timestamps).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
export XDG_RUNTIME_DIR=/tmp/rdrr-xdg RDRR_GPU_BACKEND=${RDRR_GPU_BACKEND:-vulkan}
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
for v in ${VARIANTS:?}; do
  gunzip -c ".gl/ops-$v.test.gz" > "/tmp/ops-$v.test" && chmod +x "/tmp/ops-$v.test"
done
cd gpu/ops # tests read testdata/ relative to the package
for r in $(seq "${ROUNDS:-3}"); do
  for v in $VARIANTS; do
    "/tmp/ops-$v.test" -test.run '^$' -test.bench "${BENCH:-GPU/(copy|topp|argmax)}" -test.benchtime 1x -test.count 1 2>&1 |
      grep -v Warn | grep -E '^Benchmark' | sed "s/^/$v r$r /" | tee -a "$out/ab.txt"
  done
done
