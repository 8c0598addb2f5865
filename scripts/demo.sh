#!/usr/bin/env bash
# make demo: everything that works so far, on an embedded default, in a
# throw-away home under /tmp. Talks only to loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
peer=$PWD/bin/peer
work=$(mktemp -d /tmp/rdrr-demo.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
export RDRR_HOME=$work/home
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

step "1. A peer home: content-addressed store, index and Ed25519 identity"
run $peer init

step "2. Store a 200 MiB model-like file: 64 MiB shards + a collection, hashed (BLAKE3 + bao outboard) in one pass"
head -c $((200 << 20)) /dev/urandom > "$work/model.bin"
run $peer add "$work/model.bin"
cid=$($peer add -q --json "$work/model.bin" | sed -n 's/.*"cid": "\(.*\)".*/\1/p' | head -1)
run $peer ls

step "3. Read it back, verified group by group, and compare"
run $peer get "$cid" -o "$work/model.out"
cmp "$work/model.bin" "$work/model.out" && echo "byte-exact: yes"

step "4. Damage one byte of one shard on disk: reads refuse it, scrub names it"
shard=$(ls "$RDRR_HOME"/blobs/*/* | head -1)
printf '\x00' | dd of="$shard" bs=1 seek=777777 conv=notrunc status=none
printf '\x01' | dd of="$shard" bs=1 seek=777778 conv=notrunc status=none
run $peer get "$cid" -o "$work/model.out2" || echo "(refused, as it should be)"
run $peer scrub --rate 0 || echo "(scrub exit status $?: bad blobs found and quarantined)"

step "5. Repair by adding the good bytes again"
run $peer add -q "$work/model.bin"
run $peer scrub --rate 0

step "6. Models: a synthetic MoE with a real shape (tiny-moe: 4 layers, 8 experts top-2), stored as one collection; another only as a manifest (procedural)"
run $peer synth --preset tiny-moe --seed 1 -o "$work/tiny"
model=$($peer add -q --json "$work/tiny" | sed -n 's/.*"cid": "\(.*\)".*/\1/p' | head -1)
echo "stored as $model"
proc=$($peer synth --preset tiny-moe --seed 2 --procedural -o "$work/proc" --json | sed -n 's/.*"cid": "\(.*\)".*/\1/p')
ls -la "$work/proc"
run $peer mount "$model" --vram 2MiB
echo "generate, the experts paged through a RAM budget of a quarter of them (float64 CPU reference engine; byte tokens):"
run $peer generate "$model" --prompt "The swarm is" --max-tokens 16 --ram 2MiB
echo "the same on the GPU (wgpu kernels; lavapipe without a GPU): experts paged into a 1 MiB VRAM arena, the next layer's prefetched; same tokens"
run $peer generate "$model" --prompt "The swarm is" --max-tokens 16 --ram 2MiB --engine gpu --vram 1MiB
echo "every expert resident (--warm fills VRAM first): the router's choice stays on the GPU, one read-back a token; same tokens;"
echo "--profile-gpu times every dispatch on the GPU (timestamp queries) and lists the kernels that take a step's time"
run $peer generate "$model" --prompt "The swarm is" --max-tokens 16 --ram 16MiB --engine gpu --vram 16MiB --warm --profile-gpu

step "7. A swarm on loopback: this peer seeds (daemon with an embedded signaling server), a second peer fetches over WebRTC"
port=$((20000 + RANDOM % 20000))
RDRR_HOME=$RDRR_HOME $peer daemon --signal-listen 127.0.0.1:$port --api-listen 127.0.0.1:0 --procedural "$work/proc" --log-level warn > "$work/daemon.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true; cleanup' EXIT
# Up to 60 s for its signaling server (a loaded 2-core machine is slow to
# start it), and say why if it never comes.
up=
for _ in $(seq 600); do
  if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then up=1; break; fi
  kill -0 $daemon 2>/dev/null || break
  sleep 0.1
done
if [ -z "$up" ]; then
  echo "the seeding daemon did not start listening on 127.0.0.1:$port; its log:" >&2
  cat "$work/daemon.log" >&2
  exit 1
fi
sleep 1 # the seeder signs in to its own signaling server
export RDRR_HOME=$work/home2
run $peer init
start=$(date +%s.%N)
run $peer get "$cid" -o "$work/model.fetched" --signal ws://127.0.0.1:$port --log-level warn
end=$(date +%s.%N)
cmp "$work/model.bin" "$work/model.fetched" && echo "byte-exact over the swarm: yes"
awk -v s="$start" -v e="$end" 'BEGIN { printf "200 MiB fetched and verified (every 16 KiB group) in %.1f s: %.0f MB/s\n", e-s, 200*1.048576/(e-s) }'
echo "the models: one stored by the seeder, one it regenerates on demand (checked against the manifest's hashes)"
run $peer get "$model" -o /dev/null --signal ws://127.0.0.1:$port --log-level warn
run $peer get "$proc" -o /dev/null --signal ws://127.0.0.1:$port --log-level warn
run $peer mount "$proc" --vram 2MiB
echo "a third peer holding nothing generates with the procedural model: the manifest and every expert come over the swarm, verified"
RDRR_HOME=$work/home3 $peer init > /dev/null
run env RDRR_HOME=$work/home3 $peer generate "$proc" --prompt "The swarm is" --max-tokens 8 --ram 2MiB --signal ws://127.0.0.1:$port --log-level warn
echo "the same on the GPU: experts come over the swarm into RAM, then into a 1 MiB VRAM arena"
run env RDRR_HOME=$work/home3 $peer generate "$proc" --prompt "The swarm is" --max-tokens 8 --ram 2MiB --engine gpu --vram 1MiB --signal ws://127.0.0.1:$port --log-level warn
run $peer ls
kill $daemon; wait $daemon 2>/dev/null || true
export RDRR_HOME=$work/home

step "8. The GPU: adapters, then the built-in kernels checked against their CPU references (lavapipe without a GPU)"
run $peer gpu info
run $peer gpu selftest

step "9. The kernel lab: a variant gated, timed against the built-in and endorsed on this device; a second peer's daemon hears of it by gossip, fetches it over the swarm, gates and times it again, and activates it"
run $peer kernels bench softmax
variant=$($peer --json kernels add "$(dirname "$0")/../kernels/lab/variants/softmax_wg.wgsl" --op softmax --const WG=64 2>/dev/null | sed -n 's/.*"cid": *"\([^"]*\)".*/\1/p' | head -1)
echo "variant $variant (softmax with 64-thread workgroups)"
if run $peer kernels endorse "$variant"; then
  $peer --json kernels list 2>/dev/null | sed -n 's/.*"peer": *"\([^"]*\)".*/\1/p' | head -1 > "$work/trusted.txt"
  port2=$((20000 + RANDOM % 20000))
  echo "this peer's daemon gossips its endorsement on the topic of its device class; a fresh peer's daemon trusts its key and pulls"
  $peer daemon --signal-listen 127.0.0.1:$port2 --api-listen 127.0.0.1:0 --kernel-announce-interval 2s --log-level warn > "$work/daemon-a.log" 2>&1 &
  da=$!
  trap 'kill $daemon $da 2>/dev/null || true; cleanup' EXIT
  for _ in $(seq 100); do [ -s "$RDRR_HOME/p2p.addr" ] && break; sleep 0.1; done
  export RDRR_HOME=$work/home4
  run $peer init
  $peer daemon --signal ws://127.0.0.1:$port2 --bootstrap "$(head -1 "$work/home/p2p.addr")" --api-listen 127.0.0.1:0 \
    --kernel-pull --kernel-trust-keys "$work/trusted.txt" --kernel-runs 15 --log-level warn > "$work/daemon-b.log" 2>&1 &
  db=$!
  trap 'kill $daemon $da $db 2>/dev/null || true; cleanup' EXIT
  for _ in $(seq 120); do
    $peer --json kernels status 2>/dev/null | grep -q '"activated"' && break
    sleep 1
  done
  run $peer kernels status || true
  kill $db $da 2>/dev/null; wait $db $da 2>/dev/null || true
  run $peer kernels list
  export RDRR_HOME=$work/home
else
  echo "(not endorsed: the gate or the benchmark said no, as printed)"
fi

step "10. Garbage-collect what is no longer pinned"
run $peer unpin "$cid"
run $peer gc

if [ -x "$PWD/scripts/demo-more.sh" ]; then
  "$PWD/scripts/demo-more.sh" "$peer" "$work"
fi
step "done"
