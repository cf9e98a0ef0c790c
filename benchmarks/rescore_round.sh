#!/bin/bash
# A round's runs scored again by this checkout: refit a round's two calibrations (`fidelity_round.sh`'s
# $OUT/A and $OUT/B) with this checkout's code, rescore every report of the round with them
# (nothing measured; nothing fitted to the runs scored), and print the round's table.
#   bash benchmarks/rescore_round.sh ROUND_DIR OUT_DIR     (a few seconds to a minute)
set -u
if [ $# -ne 2 ]; then
  echo "usage: bash benchmarks/rescore_round.sh ROUND_DIR OUT_DIR (ROUND_DIR: a fidelity_round.sh \$OUT)" >&2; exit 2
fi
R=$1; O=$2
HERE="$(cd "$(dirname "$0")/.." && pwd)"
T=runs/tune-qwen3-0.6b-cpu/confirm.json
for n in A B; do
  [ -f "$R/$n/profiles/qwen3-0.6b-cpu.json" ] || {
    echo "rescore_round.sh: ROUND_DIR $R: no calibration $n/profiles/qwen3-0.6b-cpu.json (not a fidelity_round.sh \$OUT?)" >&2
    exit 2; }
done
mkdir -p "$O/A/runs/tune-qwen3-0.6b-cpu" "$O/B/runs/tune-qwen3-0.6b-cpu" || exit 2

run() {  # run LOG CMD...: the command's output to LOG; on failure its last line, and exit with its code
  local log=$1; shift
  "$@" > "$log" 2>&1 || { rc=$?; echo "rescore_round.sh: $(tail -n 1 "$log") (log: $log)" >&2; exit $rc; }
}
for n in A B; do
  run "$O/refit$n.log" pdsim calibrate --refit "$R/$n/profiles/qwen3-0.6b-cpu.json" -o "$O/$n.json"
  run "$O/tune$n.log" pdsim confirm --profile "$O/$n.json" --rescore "$R/$n/$T" -o "$O/$n/$T"
done
for r in tinyllm metile gamma; do
  run "$O/$r.log" pdsim confirm --profile "$O/B.json" --rescore "$R/B/runs/confirm-$r.json" -o "$O/B/runs/confirm-$r.json"
done
python3 "$HERE/benchmarks/fidelity_table.py" "$O"
