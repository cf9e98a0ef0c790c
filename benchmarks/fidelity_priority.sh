#!/bin/bash
# Queue order: on a bursty trace with two priority classes, chunked fcfs against chunked
# priority (earliest deadline first), predicted and confirmed on the real engine (qwen3-0.6b,
# random weights, `pdsim confirm`, 2 fresh-process repeats each): the tight class's p99 TTFT
# under each, and what it costs the bulk class. Run on a quiet machine (anything else running
# slows memory-bound calls by up to 2x). Output under runs/priority/ (not committed).
#
#   bash benchmarks/fidelity_priority.sh [--profile P.json]
#
# About 7 minutes on a 2-core CPU: the confirm's 4 runs of ~40 s of trace each, in fresh processes
# (model build ~11 s, warm-up) plus the correctness gate; then ~1 minute of simulator speed.
#
# Default profile: profiles/qwen3-0.6b-cpu.json (a quick calibration of this device,
# `pdsim calibrate --model qwen3-0.6b --quick -o profiles/qwen3-0.6b-cpu.json`).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=profiles/qwen3-0.6b-cpu.json
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) PROFILE="$2"; shift 2 ;;
    *) echo "usage: $0 [--profile P.json]" >&2; exit 2 ;;
  esac
done
[ -f "$PROFILE" ] || { echo "no profile $PROFILE: pass --profile P.json (pdsim calibrate --model qwen3-0.6b --quick)" >&2; exit 2; }
PDSIM=${PDSIM:-pdsim}
REQUESTS=${REQUESTS:-14}  # a quicker check of the script itself: REQUESTS=4 REPEATS=1
REPEATS=${REPEATS:-2}
OUT=runs/priority
mkdir -p "$OUT"
STAMP=$(date +%H%M%S)
# 14 requests in bursts (gamma arrivals, burstiness 1/4, 1.5 requests/s on average): half tight
# (prompts 16..48 tokens, TTFT target 8 s), half bulk (prompts 48..256, no target); 4..8 outputs.
# The aging bound (120 s) lies above every wait here, so the order is priority's own.
TRACE=(--trace bursty-classes --num-requests "$REQUESTS" --rate 1.5 --burstiness 1/4 --min-in 16 --max-in 256
       --tight-max-in 48 --min-out 4 --max-out 8 --seed 0 --class-slo tight:ttft=8000)
SETTINGS=(--setting chunked:budget=32,batch_size=4 chunked:budget=32,batch_size=4,queue=priority,aging_s=120)
date
for q in fcfs priority; do  # the prediction alone first (seconds)
  $PDSIM simulate --profile "$PROFILE" "${TRACE[@]}" --policy chunked --budget 32 --batch-size 4 --queue $q \
    --aging-s 120 --json-out "$OUT/sim-$q-$STAMP.json" | tail -4
done
REPORT="$OUT/confirm-14q-$STAMP.json"
$PDSIM confirm --profile "$PROFILE" "${TRACE[@]}" "${SETTINGS[@]}" --repeats "$REPEATS" -o "$REPORT"
date
python3 - "$REPORT" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
res = {r["setting"].get("queue", "fcfs"): r for r in doc["results"]}  # an fcfs setting names no queue
def cell(r, cls, k):
    c = r["classes"].get(cls, {})
    if k not in c.get("measured", {}):
        return "-"
    p, m, e = c["predicted"][k], c["measured"][k]["median"], c["rel_error"][k]
    if k == "slo_attained":
        return f"{p:.0%} / {m:.0%}"
    return f"{p:,.0f} / {m:,.0f} ({'-' if e is None else format(e, '+.0%')})"
rows = [("tight p99 TTFT ms", "tight", "p99_ttft_ms"), ("tight p50 TTFT ms", "tight", "p50_ttft_ms"),
        ("tight SLO attained (8 s)", "tight", "slo_attained"),
        ("bulk p50 TTFT ms", "bulk", "p50_ttft_ms"), ("bulk p99 TTFT ms", "bulk", "p99_ttft_ms")]
print(f"\npredicted / measured median of {doc['protocol']['repeats']} runs (relative error); trace sha256 "
      f"{doc['trace']['sha256'][:12]}, profile {doc['profile']['path']}\n")
print("| metric | chunked/b32/bs4 fcfs | chunked/b32/bs4 priority |")
print("|---|---:|---:|")
for name, cls, k in rows:
    print(f"| {name} | {cell(res['fcfs'], cls, k)} | {cell(res['priority'], cls, k)} |")
for q in ("fcfs", "priority"):
    r = res[q]
    print(f"{r['label']}: output tok/s {r['predicted']['output_throughput']:.2f} / "
          f"{r['measured']['output_throughput']['median']:.2f}, makespan s {r['predicted']['makespan_s']:.1f} / "
          f"{r['measured']['makespan_s']['median']:.1f}")
PY
# The simulator's speed with the queue orders: 10,000 requests, Poisson arrivals (burstiness 1) at
# 1.5 requests/s, two classes, the built-in profile (wall time of the whole command, scoring included)
for q in fcfs sjf priority; do
  /usr/bin/time -f "10,000 Poisson requests, chunked/b128/bs8 queue $q: %e s wall, %M KB peak" \
    $PDSIM simulate --trace bursty-classes --num-requests 10000 --rate 1.5 --burstiness 1 --min-in 64 --max-in 512 \
    --min-out 32 --max-out 128 --class-slo tight:ttft=2000 --policy chunked --budget 128 --batch-size 8 --queue $q \
    | grep -E "^(engine_calls|p99_ttft_ms) "
done
date
