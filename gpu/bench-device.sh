#!/usr/bin/env bash
# Runs the gpu tests and benchmarks on the lent accelerator machine, from a
# test binary built here (that machine has no Go toolchain or module cache):
#
#   go test -c -o .gl/gpu.test ./gpu/         # on the development machine: the runtime
#   go test -c -o .gl/ops.test ./gpu/ops/     # the op library (kernel tests and benchmarks)
#   go test -c -o .gl/tiers.test ./tiers/     # optional: the tiers benchmarks too
#   # device tool: carry [".gl"], command: bash gpu/bench-device.sh
#
# .gl also holds the debs of the Vulkan loader and of glvnd (libvulkan1
# libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2, fetched as the device
# README says): NVIDIA's Vulkan ICD is libGLX_nvidia, which needs glvnd;
# with libvulkan1 alone the tests find no adapter. Logs go to
# $OUT. BENCH_ARGS adds go test flags (e.g. -test.bench 'GPU/q4k').
# BENCH_COUNT (default 5) runs the whole benchmark that many times;
# median.txt then holds each metric's median over the runs (bench-median.sh),
# which is what BENCHMARKS.md reports. BENCH_TIMEOUT (default 9m) bounds them.
# Each test binary present (gpu.test, ops.test) runs in its package's
# directory; the op library's logs are ops-test.log, ops-bench.log and
# ops-median.txt.
# RDRR_BENCH_UPLOAD_SWEEP=1 adds the upload chunk schedules and staging ring
# shapes (uploads alone: BENCH_ARGS="-test.bench GPU/(copy|upload|memcpy)").
# With .gl/tiers.test, the tiers benchmarks (RAM -> VRAM promotion against
# plain uploads, disk -> RAM verified reads against a raw read) run after
# (TIERS_COUNT times, default 3; TIERS_BENCH picks them); SKIP_GPU_BENCH=1
# runs only those.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
export XDG_RUNTIME_DIR=/tmp/rdrr-xdg RDRR_GPU_BACKEND=${RDRR_GPU_BACKEND:-vulkan}
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; nproc; } 2>&1 | tee "$out/machine.txt"
# Clocks and power while everything runs: GPUs boost only under load.
nvidia-smi --query-gpu=timestamp,pstate,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv -lms 200 > "$out/clocks.csv" 2>&1 &
smi=$!
cd gpu # tests read testdata/ relative to the package, as go test does
# run_pkg NAME DIR PREFIX: .gl/NAME.test's tests and benchmarks, run in DIR
# (relative to gpu/), logs named PREFIX*.
run_pkg() {
  local here=$PWD bin=$PWD/../.gl/$1.test
  [ -x "$bin" ] || return 0
  (
    cd "$2" || exit 1
    if [ "${SKIP_TESTS:-0}" != 1 ]; then
      "$bin" -test.count 1 -test.timeout 5m 2>&1 | grep -v '^\[wgpu\] \[Warn\]' | tee "$out/${3}test.log" | tail -15
    fi
    if [ "${SKIP_GPU_BENCH:-0}" != 1 ]; then
      "$bin" -test.run '^$' -test.bench . -test.benchtime 1x -test.count "${BENCH_COUNT:-5}" -test.timeout "${BENCH_TIMEOUT:-9m}" ${BENCH_ARGS:-} 2>&1 \
        | grep --line-buffered -v '^\[wgpu\] \[Warn\]' > "$out/${3}bench.log"
      grep -v '^Benchmark' "$out/${3}bench.log" | grep -v '^ *\(bench\|transfer_bench\)_test.go' | tail -5
      sh "$here/bench-median.sh" < "$out/${3}bench.log" | tee "$out/${3}median.txt"
    fi
  )
}
run_pkg gpu . ""
run_pkg ops ops ops-
if [ -x ../.gl/tiers.test ]; then
  (cd ../tiers && ../.gl/tiers.test -test.run '^$' -test.bench "${TIERS_BENCH:-.}" -test.benchtime 1x -test.count "${TIERS_COUNT:-3}" -test.timeout 5m 2>&1) \
    | grep --line-buffered -v '^\[wgpu\] \[Warn\]' > "$out/tiers-bench.log"
  sh bench-median.sh < "$out/tiers-bench.log" | tee "$out/tiers-median.txt"
fi
kill $smi 2>/dev/null
