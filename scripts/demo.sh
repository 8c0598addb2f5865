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

step "5. Repair by adding the good bytes again, then garbage-collect"
run $peer add -q "$work/model.bin"
run $peer scrub --rate 0
run $peer unpin "$cid"
run $peer gc

if [ -x "$PWD/scripts/demo-more.sh" ]; then
  "$PWD/scripts/demo-more.sh" "$peer" "$work"
fi
step "done"
