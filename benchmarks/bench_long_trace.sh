#!/bin/bash
# The simulator on a long trace: the Azure 2023 conversation trace repeated COPIES times (default 78:
# 1,510,548 requests), each copy shifted to start one mean inter-arrival after the one before ends,
# simulated under chunked with the built-in profile. Prints wall time and peak RSS
# (`/usr/bin/time -v`) and samples the RSS every 20 s into $OUT/rss.txt (seconds, KB).
# About 5 minutes on one core of the 2-vCPU VM (4 min 6 s at 0b97d03); run it on a quiet machine.
# usage: benchmarks/bench_long_trace.sh [COPIES] [OUT]   (OUT default /tmp/pdsim-long-trace)
set -eu
COPIES=${1:-78}
OUT=${2:-/tmp/pdsim-long-trace}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
SRC=${AZURE_CONV:-$HERE/../shared/traces/azure-2023/AzureLLMInferenceTrace_conv.csv}
PY=${PYTHON:-$HERE/.venv/bin/python}  # pdsim's environment (`bash .ci/install`), or PYTHON=...
[ -x "$PY" ] || { echo "bench_long_trace.sh: no Python at $PY: run \`bash .ci/install\` first or set PYTHON=PATH" >&2; exit 2; }
[ -f "$SRC" ] || { echo "bench_long_trace.sh: no Azure conversation trace at $SRC (set AZURE_CONV=PATH)" >&2; exit 2; }
mkdir -p "$OUT"
TRACE="$OUT/azure-conv-x$COPIES.csv"
python3 - "$SRC" "$TRACE" "$COPIES" <<'EOF'
import csv, sys
from datetime import datetime
src, dst, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, newline="") as f:
    rows = list(csv.reader(f))
header, rows = rows[0], rows[1:]
when = [datetime.fromisoformat(r[0][:26]) for r in rows]
step = (when[-1] - when[0]) + (when[-1] - when[0]) / (len(rows) - 1)  # a copy's span, and one mean gap
with open(dst + ".tmp", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(header)
    for k in range(copies):
        for t, r in zip(when, rows):
            w.writerow([(t + k * step).strftime("%Y-%m-%d %H:%M:%S.%f") + r[0][26:], *r[1:]])  # 7th digit kept
import os
os.replace(dst + ".tmp", dst)
print(f"wrote {dst}: {copies * len(rows):,} requests")
EOF
cd "$OUT"
/usr/bin/time -v env PYTHONPATH="$HERE" "$PY" -m sim.cli simulate --trace "$TRACE" --policy chunked \
  > simulate.txt 2> time.txt &
tpid=$!
sleep 1
pid=$(pgrep -P $tpid | head -1)
start=$(date +%s)
: > rss.txt
while kill -0 $tpid 2>/dev/null; do
  echo "$(( $(date +%s) - start )) $(ps -o rss= -p "$pid" 2>/dev/null)" >> rss.txt
  sleep 20
done
wait $tpid && rc=0 || rc=$?
echo "rc=$rc $(grep -E 'Elapsed|Maximum resident' time.txt | tr '\n' ' ')"
grep engine_calls simulate.txt
