#!/usr/bin/env bash
# The kernel lab on the lent accelerator machine (it has no Go toolchain),
# from binaries built here:
#
#   go build -tags nobrowser -trimpath -ldflags='-s -w' -o .gl/peer ./cmd/peer  # no wasm: carry is 64 MiB
#   go test -c -trimpath -ldflags='-s -w' -o .gl/lab.test ./kernels/lab/   # optional
#   # device tool: carry [".gl"], command: bash kernels/lab-device.sh
#
# .gl also holds the Vulkan loader and glvnd debs (see gpu/bench-device.sh).
# Steps, each logged under $OUT:
#   1. bench.txt/.json: `peer kernels bench all`: every op the lab runs, the
#      built-in timed against itself (its time, the roofline floor).
#   2. variants.txt/.json: the variants under kernels/lab/variants on
#      several shapes (and workgroup sizes), each gated and timed against
#      the built-in.
#   3. endorse.txt: the fastest endorsable one (>= 1.2x, interval above 1)
#      endorsed by peer A; B (a second home, another process) gets the
#      blobs and the signed record, verifies it, pulls it with A's key as
#      trusted (gate and timing again, here), activates it; list.txt.
#   3b. gossip.txt/.json: the same through two daemons: A's gossips the
#      record, C's (a fresh home) fetches the variant over the swarm, gates,
#      times and activates it (daemon-*.log).
#   4. test.log: the lab's Go tests (cheaters, hang, gossip) when
#      .gl/lab.test exists; SKIP_TESTS=1 skips them.
# RUNS (default 50) is the timed batches per comparison. QUICK=1 skips
# step 1 and the workgroup-size variants of step 2.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
export XDG_RUNTIME_DIR=/tmp/rdrr-xdg RDRR_GPU_BACKEND=${RDRR_GPU_BACKEND:-vulkan} RDRR_LOG_LEVEL=error
mkdir -p -m 0700 "$XDG_RUNTIME_DIR"
runs=${RUNS:-50}
peer=$PWD/.gl/peer
A=/tmp/lab-a B=/tmp/lab-b
rm -rf "$A" "$B"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; } 2>&1 | tee "$out/machine.txt"
"$peer" --home "$A" init > /dev/null && "$peer" --home "$B" init > /dev/null || exit 1
quiet() { grep -v '^\[wgpu\] \[Warn\]'; }

if [ "${QUICK:-0}" != 1 ]; then
echo "== 1. built-in kernels"
"$peer" --home "$A" kernels bench all --runs "$runs" 2>&1 | quiet | tee "$out/bench.txt"
"$peer" --home "$A" --json kernels bench all --runs "$runs" 2>/dev/null > "$out/bench.json"
fi

echo "== 2. variants"
: > "$out/variants.json"
# op file shapes... (WG values for the files with an override WG)
try() {
  local op=$1 file=$2 consts=$3; shift 3
  local cid
  cid=$("$peer" --home "$A" kernels add "kernels/lab/variants/$file" --op "$op" $consts 2>/dev/null) || { echo "add $file $consts failed"; return; }
  for shape in "$@"; do
    echo "-- $op $file $consts $shape $cid"
    "$peer" --home "$A" --json kernels bench "$op" --variant "$cid" --shape "$shape" --runs "$runs" 2>/dev/null \
      | tee -a "$out/variants.json" | python3 -c 'import json,sys
for r in json.load(sys.stdin):
  print("   gate %s  %.1f us vs %.1f us  speedup %.3f [%.3f, %.3f]  floor %.2f us  endorsable %s %s" % (r["gate"], r.get("candidateUs",0), r.get("baselineUs",0), r.get("speedup",0), r.get("speedupLow",0), r.get("speedupHigh",0), r.get("floorUs",0), r["endorsable"], r.get("error","")))'
  done
}
{
  try softmax softmax_online.wgsl "" 1x151936 8x151936 1x32000 32x4096
  try route_topk route_rank.wgsl "" 1x8x2 1x256x8 8x256x8
  [ "${QUICK:-0}" = 1 ] || for wg in 32 64 128; do
    try softmax softmax_wg.wgsl "--const WG=$wg" 1x32000 32x4096 8x151936
    try rmsnorm rmsnorm_wg.wgsl "--const WG=$wg" 1x4096 32x4096 1x7168
  done
} 2>&1 | tee "$out/variants.txt"

echo "== 3. endorse on A, pull on B"
best=$(python3 - "$out/variants.json" <<'EOF'
import json, sys
rows = []
dec = json.JSONDecoder()
s = open(sys.argv[1]).read()
i = 0
while i < len(s):
    while i < len(s) and s[i].isspace():
        i += 1
    if i >= len(s):
        break
    v, i = dec.raw_decode(s, i)
    rows += v
ok = [r for r in rows if r["endorsable"]]
if ok:
    r = max(ok, key=lambda r: r["speedupLow"])
    print(r["candidate"], "x".join(map(str, r["shape"])))
EOF
)
{
  if [ -z "$best" ]; then
    echo "no variant was endorsable here"
  else
    set -- $best
    cid=$1 shape=$2
    echo "best: $cid at $shape"
    "$peer" --home "$A" kernels endorse "$cid" --shape "$shape" --runs "$runs" --out "$out/records.jsonl" 2>&1 | quiet
    # B gets the variant's two blobs (the swarm's job once the daemon is wired) and the record.
    "$peer" --home "$A" cat "$cid" > /tmp/desc.json
    wgsl=$(python3 -c 'import json; print(json.load(open("/tmp/desc.json"))["wgsl"])')
    "$peer" --home "$A" cat "$wgsl" > /tmp/variant.wgsl
    "$peer" --home "$B" add /tmp/desc.json > /dev/null && "$peer" --home "$B" add /tmp/variant.wgsl > /dev/null
    "$peer" --home "$A" --json kernels list 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["endorsements"][0]["peer"])' > /tmp/trusted.txt
    [ -f "$out/records.jsonl" ] && "$peer" --home "$B" kernels import "$out/records.jsonl" 2>&1 | quiet
    "$peer" --home "$B" kernels pull --trust-keys /tmp/trusted.txt --runs "$runs" 2>&1 | quiet
    "$peer" --home "$B" kernels list 2>&1 | quiet | tee "$out/list.txt"
  fi
} 2>&1 | tee "$out/endorse.txt"

# 3b. The same through the swarm: A's daemon gossips its endorsement on
# its device class's topic; C's daemon (a fresh home, trusting A's key)
# receives it, fetches the variant's blobs from A over WebRTC, gates and
# times it in its own child process and activates it.
if [ -n "$best" ]; then
  C=/tmp/lab-c
  rm -rf "$C"
  "$peer" --home "$C" init > /dev/null
  sig=127.0.0.1:17001
  "$peer" --home "$A" daemon --signal-listen $sig --api-listen 127.0.0.1:0 --kernel-announce-interval 2s --log-level info 2> "$out/daemon-a.log" &
  da=$!
  sleep 3
  aaddr=$(head -1 "$A/p2p.addr")
  "$peer" --home "$C" daemon --signal ws://$sig --bootstrap "$aaddr" --api-listen 127.0.0.1:0 --kernel-pull \
    --kernel-trust-keys /tmp/trusted.txt --kernel-runs "$runs" --log-level info 2> "$out/daemon-c.log" &
  dc=$!
  python3 - "$C" "$out/gossip.json" <<'EOF2' | tee "$out/gossip.txt"
import json, sys, time, urllib.request
home, path = sys.argv[1], sys.argv[2]
deadline = time.time() + 240
st = None
while time.time() < deadline:
    time.sleep(2)
    try:
        api = open(home + "/api.addr").read().strip()
        st = json.load(urllib.request.urlopen(api + "/api/v1/kernels", timeout=5))
    except Exception as e:
        continue
    if any(p.get("activated") for p in st.get("pulls", [])):
        break
json.dump(st, open(path, "w"), indent=1)
if st is None:
    print("C: no kernel status")
else:
    print("C: class", st["class"], "received", st["received"], "endorsements", len(st["endorsements"] or []))
    for p in st.get("pulls") or []:
        print("C: pulled %s %s %s: measured %.3fx activated %s %s" % (p["op"], p["variant"], p["shape"], p.get("measuredSpeedup", 0), p["activated"], p.get("error", "")))
EOF2
  kill $dc $da; wait $dc $da 2>/dev/null
  "$peer" --home "$C" kernels list 2>&1 | quiet | tee -a "$out/gossip.txt"
fi

if [ -x .gl/lab.test ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== 4. lab tests"
  (cd kernels/lab && ../../.gl/lab.test -test.count 1 -test.timeout 8m -test.v 2>&1) | quiet \
    | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go' > "$out/test.log"
  grep -E '^(--- FAIL|FAIL|PASS|ok)' "$out/test.log" | tail -15
fi
