#!/bin/bash
# Issue 15's "every policy option": the options `measure_15.sh` does not run, confirmed with one
# profile of qwen3-0.6b: a KV limit with preemptions (`measure_14k.sh`), priority classes
# (`measure_14q.sh`), adaptive budgets (`measure_14b.sh`), then the sjf queue (eager and fifo) and the
# whole-prompt idle budget (chunked) on a gamma workload (12 requests, burstiness 1/3, 1.5/s,
# prompts 9..333, outputs 3..21, GAMMA_SEED, default 909). On a quiet machine, about 43 minutes on
# 2 cores (stop 49: 14k 6, 14q 6, 14b 16, the gamma confirm 15). Reports under runs/ (not
# committed); the table: `python3 benchmarks/measure_15_table.py REPORT...`.
#   bash benchmarks/measure_15_options.sh --profile P.json
set -u
PROFILE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE="${2:-}"; shift 2 || shift ;;
    *) echo "measure_15_options.sh: unknown argument $1 (usage: --profile P.json)" >&2; exit 2 ;;
  esac
done
[ -n "$PROFILE" ] || { echo "measure_15_options.sh: --profile P.json is required (a calibration of qwen3-0.6b)" >&2; exit 2; }
[ -f "$PROFILE" ] || { echo "measure_15_options.sh: --profile $PROFILE: no such file" >&2; exit 2; }
PROFILE="$(cd "$(dirname "$PROFILE")" && pwd)/$(basename "$PROFILE")"  # before the cd below
cd "$(dirname "$0")/.."
PDSIM=${PDSIM:-pdsim}
SEED=${GAMMA_SEED:-909}
mkdir -p runs
bash benchmarks/measure_14k.sh --profile "$PROFILE" -o runs/m14k > runs/m14k.log 2>&1; echo "14k rc=$? $(date)"
bash benchmarks/measure_14q.sh --profile "$PROFILE" > runs/m14q.log 2>&1; echo "14q rc=$? $(date)"
bash benchmarks/measure_14b.sh --profile "$PROFILE" --out runs/m14b > runs/m14b.log 2>&1; echo "14b rc=$? $(date)"
$PDSIM traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
  --min-out 3 --max-out 21 --seed "$SEED" -o "runs/gamma$SEED.jsonl" --overwrite || exit $?
$PDSIM confirm --profile "$PROFILE" --trace "runs/gamma$SEED.jsonl" \
  --setting chunked:budget=32,batch_size=4,idle_budget=whole eager:batch_size=4,queue=sjf fifo:queue=sjf \
  --repeats 3 -o "runs/confirm-options-$SEED-$(date +%H%M%S).json" > runs/options.log 2>&1; echo "options rc=$? $(date)"
