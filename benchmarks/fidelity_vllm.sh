#!/bin/bash
# vLLM's scheduler on the real engine: in fresh clones of this checkout's HEAD (one per
# calibration, `bash .ci/install` then the commands), a quick calibration of qwen3-0.6b, then
# confirms of vllm at a small and a large token budget and of chunked b32 as the baseline (and
# eager, on gamma: the CPU's accuracy a calibration holds), on a gamma workload (12 requests, burstiness 1/3, 1.5/s, prompts 9-333, outputs 3-21) and on the
# tiny-llm seed's trace scaled as docs/results.md's (prompts 16-128, 8 outputs). On a quiet
# machine, about 40 minutes per calibration on 2 cores. Reports under $OUT (default
# /tmp/pdsim-vllm); the table: `python3 benchmarks/fidelity_table.py $OUT/*/runs/confirm-*.json`.
# CALIBRATIONS (default "A B") names the calibrations to make; GAMMA_SEED the workload's seed.
set -u
OUT=${OUT:-/tmp/pdsim-vllm}
GAMMA_SEED=${GAMMA_SEED:-31}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
export CI=true
SETTINGS="vllm:max_num_batched_tokens=32,max_num_seqs=4 vllm:max_num_batched_tokens=512,max_num_seqs=4 chunked:budget=32,batch_size=4"
for n in ${CALIBRATIONS:-A B}; do
  rm -rf "$OUT/$n"
  git clone -q "$HERE" "$OUT/$n"
  cd "$OUT/$n" || exit 2
  echo "install $n $(date)"
  bash .ci/install > "$OUT/install$n.log" 2>&1 || { echo "install $n failed"; exit 1; }
  P=profiles/qwen3-0.6b-cpu.json
  echo "calibrate $n $(date)"
  .venv/bin/pdsim calibrate --model qwen3-0.6b --quick -o $P > "$OUT/calibrate$n.log" 2>&1
  echo "calibrate $n rc=$? $(date)"
  .venv/bin/pdsim traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
    --min-out 3 --max-out 21 --seed $GAMMA_SEED -o runs/gamma12.jsonl
  .venv/bin/pdsim confirm --profile $P --trace runs/gamma12.jsonl --setting $SETTINGS eager:batch_size=4 --repeats 3 \
    -o runs/confirm-gamma.json > "$OUT/gamma$n.log" 2>&1
  echo "gamma $n rc=$? $(date)"
  .venv/bin/pdsim confirm --profile $P --trace tinyllm --min-in 16 --max-in 128 --min-out 8 --max-out 8 \
    --setting $SETTINGS --repeats 3 -o runs/confirm-tinyllm.json > "$OUT/tinyllm$n.log" 2>&1
  echo "tinyllm $n rc=$? $(date)"
  cd "$HERE" || exit 2
done
