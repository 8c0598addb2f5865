#!/usr/bin/env bash
# The paged-generation issue's 671B case on the lent accelerator machine: a
# seeder daemon serves a procedural DeepSeek-V3-shaped model (regenerated on
# demand, never stored: 380 GB do not fit that machine's disk) over
# loopback, and `peer generate --engine gpu` pages its experts from it over
# the swarm (WebRTC data channels), through RAM into VRAM.
#   device tool: carry ["bin", ".gl"], command: bash scripts/generate-swarm-device.sh
# PRESET (default deepseek-v3-671b), TOKENS (8), PROMPT ("Hi"), VRAM
# (60GiB), RAM (100GiB) choose the run. Logs and the --json result go to $OUT.
# bin/peer for it: go build -tags nobrowser -trimpath -ldflags='-s -w' -o bin/peer ./cmd/peer
# (without the browser peer's WebAssembly: a carry holds 64 MiB in all).
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
. "$(dirname "$0")/device-env.sh"
peer=${PEER:-$PWD/bin/peer}
preset=${PRESET:-deepseek-v3-671b}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null; nproc; } | tee "$out/machine.txt"
rm -rf /tmp/model /tmp/h-seed /tmp/h-gen
cid=$($peer synth -q --preset "$preset" --procedural -o /tmp/model --json 2>/dev/null | sed -n 's/.*"cid": *"\([^"]*\)".*/\1/p')
echo "model $preset $cid" | tee -a "$out/machine.txt"
$peer --home /tmp/h-seed init >/dev/null 2>&1
$peer --home /tmp/h-gen init >/dev/null 2>&1
$peer --home /tmp/h-seed daemon --signal-listen 127.0.0.1:7741 --procedural /tmp/model/manifest.json --log-level warn >"$out/seeder.log" 2>&1 &
seeder=$!
trap 'kill $seeder 2>/dev/null' EXIT
sleep 3
/usr/bin/time -f "generate: %e s, %M KB max RSS" $peer --home /tmp/h-gen generate "$cid" --signal ws://127.0.0.1:7741 --engine gpu \
  --vram "${VRAM:-60GiB}" --ram "${RAM:-100GiB}" --prompt "${PROMPT:-Hi}" --max-tokens "${TOKENS:-8}" --json --log-level warn \
  2>"$out/generate.err" | grep -v '^\[wgpu\]' > "$out/generate.json"
tail -3 "$out/generate.err"
python3 - "$out/generate.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("tokens", r["promptTokens"], "+", len(r["tokens"]), "in %.1f s: %.3f tok/s" % (r["seconds"], r["tokPerSec"]))
for l in r["levels"]:
    if l["hits"] + l["misses"] > 0:
        print("  %-6s hits %d misses %d up %.1f GiB" % (l["level"], l["hits"], l["misses"], l["bytesUp"] / 2**30))
p = r.get("profile", {})
if p.get("steps"):
    print("  per step: total %.0f ms, paging stall %.0f ms" % (p["totalNs"] / p["steps"] / 1e6, p["pageWaitNs"] / p["steps"] / 1e6))
PY
