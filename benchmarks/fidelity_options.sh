#!/bin/bash
# Every policy option a fresh round (`fidelity_round.sh`) does not run, confirmed with one
# profile of qwen3-0.6b: a KV limit with preemptions (`fidelity_kv_limit.sh`), priority classes
# (`fidelity_priority.sh`), adaptive budgets (`fidelity_auto_budget.sh`), then the sjf queue (eager and fifo) and the
# whole-prompt idle budget (chunked) on a gamma workload (12 requests, burstiness 1/3, 1.5/s,
# prompts 9..333, outputs 3..21, GAMMA_SEED, default 909). On a quiet machine, about 43 minutes on
# 2 cores (KV limit 6, priority 6, auto budgets 16, the gamma confirm 15). Reports under runs/ (not
# committed); the table: `python3 benchmarks/fidelity_table.py REPORT...`.
#   bash benchmarks/fidelity_options.sh --profile P.json
set -u
PROFILE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE="${2:-}"; shift 2 || shift ;;
    *) echo "fidelity_options.sh: unknown argument $1 (usage: --profile P.json)" >&2; exit 2 ;;
  esac
done
[ -n "$PROFILE" ] || { echo "fidelity_options.sh: --profile P.json is required (a calibration of qwen3-0.6b)" >&2; exit 2; }
[ -f "$PROFILE" ] || { echo "fidelity_options.sh: --profile $PROFILE: no such file" >&2; exit 2; }
PROFILE="$(cd "$(dirname "$PROFILE")" && pwd)/$(basename "$PROFILE")"  # before the cd below
cd "$(dirname "$0")/.."
PDSIM=${PDSIM:-pdsim}
SEED=${GAMMA_SEED:-909}
mkdir -p runs
bash benchmarks/fidelity_kv_limit.sh --profile "$PROFILE" -o runs/kv-limit > runs/kv-limit.log 2>&1; echo "kv-limit rc=$? $(date)"
bash benchmarks/fidelity_priority.sh --profile "$PROFILE" > runs/priority.log 2>&1; echo "priority rc=$? $(date)"
bash benchmarks/fidelity_auto_budget.sh --profile "$PROFILE" --out runs/auto-budget > runs/auto-budget.log 2>&1; echo "auto-budget rc=$? $(date)"
$PDSIM traces gen gamma --num-requests 12 --rate 1.5 --burstiness 1/3 --min-in 9 --max-in 333 \
  --min-out 3 --max-out 21 --seed "$SEED" -o "runs/gamma$SEED.jsonl" --overwrite || exit $?
$PDSIM confirm --profile "$PROFILE" --trace "runs/gamma$SEED.jsonl" \
  --setting chunked:budget=32,batch_size=4,idle_budget=whole eager:batch_size=4,queue=sjf fifo:queue=sjf \
  --repeats 3 -o "runs/confirm-options-$SEED-$(date +%H%M%S).json" > runs/options.log 2>&1; echo "options rc=$? $(date)"
