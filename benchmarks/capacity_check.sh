#!/bin/bash
# The capacity question asked of the real engine: in a fresh clone of this checkout's HEAD, with
# Debian's own Python first on the PATH, README's first command verbatim (`bash .ci/install &&
# .venv/bin/pdsim tune`: a quick calibration, the capacity search, the pick and eager confirmed at
# the pick's capacity, the SLOs checked predicted and measured), then the confirm tune prints for
# 1.3x the pick's capacity, where the SLOs should break. About an hour on 2 cores; logs and reports
# under $OUT (default /tmp/pdsim-capacity), the verdicts printed at the end.
set -u
OUT=${OUT:-/tmp/pdsim-capacity}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
rm -rf "$OUT"
mkdir -p "$OUT"
git clone -q "$HERE" "$OUT/clone"
cd "$OUT/clone" || exit 2
export CI=true PATH=/usr/bin:/bin
echo "tune $(date)"
/usr/bin/time -f "%e s" bash -c 'bash .ci/install && .venv/bin/pdsim tune' > "$OUT/tune.log" 2>&1
echo "tune rc=$? $(date)"
above=$(grep -A1 "1.3x it):" "$OUT/tune.log" | tail -1 | sed 's/^ *//')
[ -n "$above" ] || { echo "tune printed no confirm above capacity"; exit 1; }
eval "/usr/bin/time -f '%e s' .venv/bin/$above --repeats 3" > "$OUT/above.log" 2>&1  # the command as printed, quotes and all
echo "above rc=$? $(date)"
.venv/bin/python - runs/tune-*/confirm.json runs/tune-*/confirm-above.json <<'PY'
import json, math, sys
num = lambda v: math.nan if v is None else v
for path in sys.argv[1:]:
    doc = json.load(open(path))
    meta = doc["trace"]["meta"]  # the capacity's confirm scales the rate; the one above it speeds the trace up
    scale = meta.get("rate_scale") or next((s["factor"] for s in meta.get("shaping", ()) if s["op"] == "speed"), 1)
    print(f"{path}: {scale:.4g}x the rate of tune's trace")
    for res in doc["results"]:
        for v in res.get("slo", ()):
            err = res["rel_error"].get(v["slo"].split("<")[0].split(">")[0])
            print(f"  {res['label']:<18} {v['slo']:<26} predicted {num(v['predicted']):9.1f} "
                  f"({'holds' if v['holds_predicted'] else 'broken'}), measured {num(v['measured']):9.1f} "
                  f"({'holds' if v['holds_measured'] else 'broken'}), error {num(err):+.1%}")
PY
