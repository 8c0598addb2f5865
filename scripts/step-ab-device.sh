#!/usr/bin/env bash
# A/Bs inside the decode step (RDRR_GPU_AB, experts/ab.go) on the lent
# machine: each toggle alternated every 10 steps of one generation, ROUNDS
# generations each, so that both settings see the same tokens, positions,
# GPU and clocks:
#   PEER=.gl/peer.gz TOGGLES="routenorm xqattn" ROUNDS=2 bash scripts/step-ab-device.sh
# PEER is a peer binary (name.gz is unpacked); PRESET (mixtral-8x7b), VRAM
# (70GiB), RAM (100GiB: the warm then ends copying RAM to VRAM, and the
# GPU is busy when the run starts), TOKENS (600), PROMPT (H), BUDGET (500:
# seconds after which no new generation starts; one takes ~30 s on an H200
# with Mixtral's shape, most of it loading). Output: $OUT/step-ab.txt, a
# line a generation: the toggle's medians and on/off, and the run's median
# step and tok/s.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
. "$(dirname "$0")/device-env.sh"
peer=${PEER:?}
if [[ $peer == *.gz ]]; then gunzip -kf "$peer"; peer=${peer%.gz}; fi
chmod +x "$peer"
preset=${PRESET:-mixtral-8x7b}
start=$(date +%s)
"$peer" synth -q --preset "$preset" --procedural -o "/tmp/$preset" >/dev/null 2>&1
gen() { # toggle ("": none), then flags
  local toggle=$1
  shift
  RDRR_GPU_AB=$toggle "$peer" --home /tmp/h-step generate - --procedural "/tmp/$preset/manifest.json" --engine gpu \
    --vram "${VRAM:-70GiB}" --ram "${RAM:-100GiB}" --prompt "${PROMPT:-H}" --log-level error --warm "$@"
}
# One uncounted generation first: the first on a fresh machine ran slower.
gen "" --max-tokens 8 >/dev/null 2>&1
for round in $(seq 1 "${ROUNDS:-1}"); do
  for t in ${TOGGLES:?}; do
    if (( $(date +%s) - start > ${BUDGET:-500} )); then
      echo "skipped $t (round $round): past BUDGET" | tee -a "$out/step-ab.txt"
      continue
    fi
    echo "== $t (round $round)" | tee -a "$out/step-ab.txt"
    gen "$t" --max-tokens "${TOKENS:-600}" 2>&1 | grep -E "A/B inside|median step|tok/s|rror" | tee -a "$out/step-ab.txt"
  done
done
