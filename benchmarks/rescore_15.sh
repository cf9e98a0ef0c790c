#!/bin/bash
# Issue 15's before/after on the same runs: refit a round's two calibrations (`measure_15.sh`'s
# $OUT/A and $OUT/B) with this checkout's code, rescore every report of the round with them
# (nothing measured; nothing fitted to the runs scored), and print the round's table.
#   bash benchmarks/rescore_15.sh ROUND_DIR OUT_DIR     (a few seconds to a minute)
set -eu
R=$1; O=$2
HERE="$(cd "$(dirname "$0")/.." && pwd)"
T=runs/tune-qwen3-0.6b-cpu/confirm.json
mkdir -p "$O/A/runs/tune-qwen3-0.6b-cpu" "$O/B/runs/tune-qwen3-0.6b-cpu"
for n in A B; do
  pdsim calibrate --refit "$R/$n/profiles/qwen3-0.6b-cpu.json" -o "$O/$n.json" > "$O/refit$n.log" 2>&1
  pdsim confirm --profile "$O/$n.json" --rescore "$R/$n/$T" -o "$O/$n/$T" > "$O/tune$n.log" 2>&1
done
for r in tinyllm metile gamma; do
  pdsim confirm --profile "$O/B.json" --rescore "$R/B/runs/confirm-$r.json" -o "$O/B/runs/confirm-$r.json" \
    > "$O/$r.log" 2>&1
done
python3 "$HERE/benchmarks/measure_15_table.py" "$O"
