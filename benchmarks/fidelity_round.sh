#!/bin/bash
# A fresh fidelity round: what a user runs first, `bash .ci/install && .venv/bin/pdsim tune`, in two fresh
# clones of this checkout's HEAD (two calibrations, so the spread between them shows), then the
# two seed experiments (docs/results.md) and the gamma workload with the second calibration; every confirm
# probes the machine's speed around each run (`calibrate/measure/speed_probe.py`). On a quiet machine
# (about 50 minutes on 2 cores). Clones (each with its .venv) and reports under $OUT (default /tmp/pdsim-round);
# the summary table: `python3 benchmarks/fidelity_table.py $OUT`. GAMMA_SEED (default 7) picks the
# gamma workload's seed: a new one each round keeps it a workload nothing was tuned on.
# TUNES_ONLY=1 stops after the two tunes (about 38 minutes); TUNES=B runs calibration B only (its clone
# and tune, then the seeds and gamma on it).
set -u
OUT=${OUT:-/tmp/pdsim-round}
GAMMA_SEED=${GAMMA_SEED:-7}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
export CI=true
for n in ${TUNES:-A B}; do
  rm -rf "$OUT/$n"
  git clone -q "$HERE" "$OUT/$n"
  echo "tune $n start $(date)"
  ( cd "$OUT/$n" && \
    /usr/bin/time -f "%e s" bash -c 'bash .ci/install && .venv/bin/pdsim tune' > "$OUT/tune$n.log" 2>&1 )
  echo "tune $n rc=$? $(date)"
done
[ "${TUNES_ONLY:-0}" = 1 ] && exit 0
cd "$OUT/B" && source .venv/bin/activate
P=profiles/qwen3-0.6b-cpu.json
pdsim confirm --profile $P --trace tinyllm --min-in 16 --max-in 128 \
  --min-out 8 --max-out 8 --policy chunked --budget 8 32 128 --batch-size 4 --repeats 4 \
  -o runs/confirm-tinyllm.json > "$OUT/tinyllm.log" 2>&1
echo "tinyllm rc=$? $(date)"
pdsim confirm --profile $P --trace metile --prompt-len 256 --output-len 32 \
  --setting fifo eager chunked:budget=16,order=decode-first --decode single --repeats 3 \
  -o runs/confirm-metile.json > "$OUT/metile.log" 2>&1
echo "metile rc=$? $(date)"
pdsim traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
  --min-out 3 --max-out 21 --seed $GAMMA_SEED -o runs/gamma12.jsonl
pdsim confirm --profile $P --trace runs/gamma12.jsonl \
  --setting chunked:budget=32,batch_size=4 eager:batch_size=4 --repeats 3 -o runs/confirm-gamma.json \
  > "$OUT/gamma.log" 2>&1
echo "gamma rc=$? $(date)"
