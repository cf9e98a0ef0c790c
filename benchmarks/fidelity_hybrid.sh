#!/bin/bash
# A hybrid model's fidelity, as a user meets it: a fresh clone, `bash .ci/install`, a quick
# calibration of the hybrid model (qwen3.5-0.8b: Gated DeltaNet and attention layers, 3 to 1),
# then confirms on the real engine: chunked at two budgets and eager (batch size 4) on a gamma
# workload (12 requests, burstiness 1/3, 1.5 req/s, prompts 9-333, outputs 3-21) and on the
# tiny-llm seed's trace, and a --kv-limit run that preempts; then a quick calibration of mlx-lm's
# BatchGenerator on the same model and a confirm of one mlx-lm setting on the gamma workload.
# Twice (calibrations A and B), so the spread between fresh calibrations shows. Then the dense
# model of similar size (qwen3-0.6b) is calibrated in clone A, and the two are put side by side
# (benchmarks/hybrid_vs_dense.py: the budget `pdsim tune` would pick for each, the decode gap each
# budget causes; the report's chart of a chunk's cost against its offset). On a quiet machine;
# about 50 minutes a calibration on 2 cores.
# Reports under $OUT (default /tmp/pdsim-hybrid). The KV limit (1,700 tokens, the state of each
# request counted: 822 tokens' worth) preempts once in the simulation of that workload.
# CALS="A" runs one calibration; DENSE=0 skips the dense side.
set -u
OUT=${OUT:-/tmp/pdsim-hybrid}
SEED=${GAMMA_SEED:-11}
MODEL=${MODEL:-qwen3.5-0.8b}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
export CI=true
for n in ${CALS:-A B}; do
  rm -rf "$OUT/$n"
  git clone -q "$HERE" "$OUT/$n"
  (
    cd "$OUT/$n" || exit 2
    bash .ci/install > "$OUT/install$n.log" 2>&1 && source .venv/bin/activate || exit 2
    P=profiles/hybrid.json
    echo "calibrate $n start $(date)"
    /usr/bin/time -f "%e s" pdsim calibrate --model "$MODEL" --quick -o $P > "$OUT/calibrate$n.log" 2>&1 || exit 2
    echo "calibrate $n done $(date)"
    pdsim traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
      --min-out 3 --max-out 21 --seed "$SEED" -o runs/gamma12.jsonl
    pdsim confirm --profile $P --trace runs/gamma12.jsonl --repeats ${REPEATS:-2} \
      --setting chunked:budget=32,batch_size=4 chunked:budget=128,batch_size=4 eager:batch_size=4 \
      -o runs/confirm-gamma.json > "$OUT/gamma$n.log" 2>&1
    echo "gamma $n rc=$? $(date)"
    pdsim confirm --profile $P --trace tinyllm --min-in 16 --max-in 128 --min-out 8 --max-out 8 \
      --policy chunked --budget 32 128 --batch-size 4 --repeats ${REPEATS:-2} -o runs/confirm-tinyllm.json > "$OUT/tinyllm$n.log" 2>&1
    echo "tinyllm $n rc=$? $(date)"
    pdsim confirm --profile $P --trace runs/gamma12.jsonl --repeats 2 \
      --setting chunked:budget=32,batch_size=4,kv_limit=1700 -o runs/confirm-kvlimit.json > "$OUT/kvlimit$n.log" 2>&1
    echo "kvlimit $n rc=$? $(date)"
    pdsim calibrate --model "$MODEL" --engine mlx-lm --quick -o profiles/hybrid-mlx-lm.json > "$OUT/calibrate-mlxlm$n.log" 2>&1
    pdsim confirm --engine mlx-lm --profile profiles/hybrid-mlx-lm.json --trace runs/gamma12.jsonl \
      --repeats ${REPEATS:-2} --setting mlx-lm:prefill_step=128,prompt_concurrency=4,decode_concurrency=4 \
      -o runs/confirm-mlxlm.json > "$OUT/mlxlm$n.log" 2>&1
    echo "mlx-lm $n rc=$? $(date)"
  )
done
[ "${DENSE:-1}" = 1 ] || exit 0
cd "$OUT/A" && source .venv/bin/activate || exit 2
pdsim calibrate --model qwen3-0.6b --quick -o profiles/dense.json > "$OUT/calibrate-dense.log" 2>&1
python benchmarks/hybrid_vs_dense.py profiles/dense.json profiles/hybrid.json > "$OUT/side-by-side.txt" 2>&1
pdsim report --confirm runs/confirm-gamma.json --profile profiles/hybrid.json profiles/dense.json -o "$OUT/report" \
  > "$OUT/report.log" 2>&1
echo "dense, side by side and report rc=$? $(date)"
