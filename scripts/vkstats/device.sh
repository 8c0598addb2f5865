#!/usr/bin/env bash
# Registers a thread of the decode step's kernels on the lent GPU: run on
# the device machine from the repository root, with .gl holding the
# Vulkan debs (scripts/device-env.sh), vkcompile.gz and vkl/ (the layer
# and its manifest). Prepare them here:
#
#   gcc -shared -fPIC -O2 -fvisibility=hidden -Wl,-Bsymbolic \
#     -o .gl/vkl/libvkstats.so scripts/vkstats/vkstats.c
#   cp scripts/vkstats/VkLayer_rdrr_stats.json .gl/vkl/
#   go build -tags nobrowser -trimpath -ldflags='-s -w' -o /tmp/vkcompile ./scripts/vkstats/compile
#   gzip -c /tmp/vkcompile > .gl/vkcompile.gz
#
# then (device tool) carry [".gl"], command: bash scripts/vkstats/device.sh
# [ARGS...]; ARGS go to vkcompile (default -all: every built-in). Prints a
# line a kernel: its name and constants, then the driver's statistics.
set -u
. scripts/device-env.sh
gunzip -c .gl/vkcompile.gz > /tmp/vkcompile && chmod +x /tmp/vkcompile
out=${OUT:-/tmp}/vkstats.txt
VK_LAYER_PATH=$PWD/.gl/vkl VK_INSTANCE_LAYERS=VK_LAYER_RDRR_stats /tmp/vkcompile "${@:--all}" > "$out" 2>&1
rc=$?
# A kernel's line, then the layer's for it; a compile that failed has
# none (vkcompile names it and its error instead).
awk '/^compile: / { if (name != "") print name "  (no statistics)"; name = $0; next }
     /^vkstats: module/ { sub(/spv 0x[0-9a-f]+ /, ""); sub(/\| Local Memory Size=[0-9]+ /, ""); print name "  " $0; name = ""; next }
     END { if (name != "") print name "  (no statistics)" }' "$out"
exit $rc
