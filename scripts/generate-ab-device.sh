#!/usr/bin/env bash
# A/B of peer builds with `peer generate --engine gpu` on the lent machine,
# in one session so that every build sees the same GPU and host:
#   PEERS=".gl/peer-old .gl/peer-new" RUNS="--warm;--warm --profile-gpu" bash scripts/generate-ab-device.sh
# Each PEERS entry is a peer binary (gzipped ones, name.gz, are unpacked);
# RUNS is a ';'-separated list of flag sets, each run with every build in
# turn, ROUNDS times (default 1, alternating builds). PRESET (default
# mixtral-8x7b), VRAM (70GiB), TOKENS (40), PROMPT (H), WARMUP (1: one
# uncounted run of the first build first). Output:
# $OUT/ab.txt, and each run's CPU profile in $OUT/ab-pprof.tgz.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/ab
. "$(dirname "$0")/device-env.sh"
peers=()
for p in ${PEERS:?}; do
  if [[ $p == *.gz ]]; then gunzip -kf "$p"; p=${p%.gz}; fi
  chmod +x "$p"; peers+=("$PWD/$p")
done
preset=${PRESET:-mixtral-8x7b}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$out/ab.txt"
${peers[0]} synth -q --preset $preset --procedural -o /tmp/$preset >/dev/null 2>&1
IFS=';' read -ra runs <<< "${RUNS:---warm}"
# The first generation on a fresh machine ran 7-9% slower than the same
# build's later runs (its host recorded each step ~1 ms slower), which
# penalized whichever build came first in round 1.
# WARMUP (default 1) runs the first build once first, 8 tokens, not
# counted; WARMUP=0 skips it.
if [ "${WARMUP:-1}" != 0 ]; then
  echo "== warm-up: $(basename ${peers[0]}) (not counted)" | tee -a "$out/ab.txt"
  ${peers[0]} --home /tmp/h-ab generate - --procedural /tmp/$preset/manifest.json --engine gpu --vram ${VRAM:-70GiB} --ram 100GiB \
    --prompt "${PROMPT:-H}" --max-tokens 8 --log-level error ${runs[0]} >/dev/null 2>&1
fi
n=0
for round in $(seq 1 ${ROUNDS:-1}); do
  for flags in "${runs[@]}"; do
    for p in "${peers[@]}"; do
      n=$((n+1))
      echo "== run $n: $(basename $p) $flags (round $round)" | tee -a "$out/ab.txt"
      $p --home /tmp/h-ab generate - --procedural /tmp/$preset/manifest.json --engine gpu --vram ${VRAM:-70GiB} --ram 100GiB \
        --prompt "${PROMPT:-H}" --max-tokens ${TOKENS:-40} --cpuprofile /tmp/ab/run$n.pprof --log-level warn $flags 2>&1 \
        | grep -v "^\[wgpu\]" | tee -a "$out/ab.txt"
    done
  done
done
tar czf "$out/ab-pprof.tgz" -C /tmp/ab .
