#!/bin/bash
# The simulator's speed against an older checkout, in one run on one machine so the ratios are
# fair: 10,000 Poisson requests (chunked b128 bs8, eager bs8), `pdsim simulate` on the Azure 2023
# conversation trace (chunked b128 bs16) and a sweep of 3 policies x 10 budgets over it
# (2 processes), each with the built-in profile; then this checkout's figures with the stored CPU
# profile that prices page faults (benchmarks/fixtures). About 6 minutes; run on a quiet machine.
# usage: benchmarks/bench_vs.sh OLD_CHECKOUT [PYTHON]   (e.g. a worktree of c8c43b1)
set -u
OLD=${1:?usage: bench_vs.sh OLD_CHECKOUT [PYTHON]}
PY=${2:-python3}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
AZURE=${AZURE_CONV:-$HERE/../shared/traces/azure-2023/AzureLLMInferenceTrace_conv.csv}
CPU="$HERE/benchmarks/fixtures/cpu-qwen3-0.6b.json"
BUDGETS="16 32 48 64 96 128 192 256 384 512"
secs() { /usr/bin/time -f "%e s, %M KB peak" "$@" 2>&1 >/dev/null | tail -1; }
for tree in "$OLD" "$HERE"; do
  echo "== $tree ($(git -C "$tree" rev-parse --short HEAD))"
  export PYTHONPATH="$tree"
  cd "$tree" || exit 2
  if [ "$tree" = "$HERE" ]; then
    $PY benchmarks/bench_sim.py --requests 10000 --only chunked/b128/bs8 eager/bs8 --profile sim/data/*.json | grep -v "/single\|decode-first\|idle\|sjf\|priority\|kv4096"
  else
    $PY benchmarks/bench_sim.py --requests 10000
  fi
  echo "simulate azure conv, chunked b128 bs16: $(secs $PY -m sim.cli simulate --trace "$AZURE" --policy chunked --budget 128 --batch-size 16)"
  rm -rf /tmp/bench-vs-sweep
  echo "sweep azure conv, 3 policies x 10 budgets, 2 processes: $(secs $PY -m sim.cli sweep --trace "$AZURE" --policy fifo eager chunked --budget $BUDGETS --batch-size 16 --workers 2 --no-progress -o /tmp/bench-vs-sweep)"
done
cd "$HERE" || exit 2
export PYTHONPATH="$HERE"
echo "== $HERE with the CPU profile that prices page faults"
$PY benchmarks/bench_sim.py --requests 10000 --only chunked/b128/bs8 eager/bs8 --profile "$CPU" | grep -v "/single\|decode-first\|idle\|sjf\|priority\|kv4096"
echo "simulate azure conv, chunked b128 bs16: $(secs $PY -m sim.cli simulate --trace "$AZURE" --policy chunked --budget 128 --batch-size 16 --profile "$CPU" --force)"
rm -rf /tmp/bench-vs-sweep
echo "sweep azure conv, 3 policies x 10 budgets, 2 processes: $(secs $PY -m sim.cli sweep --trace "$AZURE" --policy fifo eager chunked --budget $BUDGETS --batch-size 16 --workers 2 --no-progress --profile "$CPU" --force -o /tmp/bench-vs-sweep)"
