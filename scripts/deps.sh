#!/usr/bin/env bash
# Installs, idempotently, the system packages that the build and the tests
# need: the CPU Vulkan driver (lavapipe) for GPU tests on machines without a
# GPU, and chromium for the browser peer's tests (e2e/browser_test.go).
# Go itself is assumed present (see README).
set -euo pipefail
pkgs=(mesa-vulkan-drivers libvulkan1 ca-certificates chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The patched-dependency module file must exist before any go command
# that the Makefile runs with -modfile.
unset GOFLAGS
"$(dirname "$0")/patched-deps.sh"
go mod download
