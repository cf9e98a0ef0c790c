#!/bin/bash
# Peak memory predicted against measured on the real engine, qwen3-0.6b, for
# six settings (chunked, budget 16/64/256 x batch size 1/4), with `pdsim confirm`; prints the
# table and the median |error| (target <= 10%), on the whole peak and on the part above the
# weights (the KV buffers and the largest call's temporaries, what the setting changes).
#
#   bash benchmarks/fidelity_memory.sh --profile PATH [--repeats N]
#
# PATH: a quick calibration made by this code (it measures the memory terms), e.g.
#   pdsim calibrate --model qwen3-0.6b --quick -o profiles/qwen3-0.6b-cpu-mem.json   # 8-10 min
# The confirm: 6 settings x 2 fresh-process repeats of 4 requests at t=0 (prompts 200..460,
# 8 outputs), about 12-16 minutes on a 2-core CPU. Output under runs/memory/ (not committed).
set -e
cd "$(dirname "$0")/.."
profile="" repeats=2
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    *) echo "fidelity_memory.sh: unknown argument $1 (expected --profile PATH [--repeats N])" >&2; exit 2 ;;
  esac
done
if [ -z "$profile" ]; then
  echo "fidelity_memory.sh: --profile PATH is required (pdsim calibrate --model qwen3-0.6b --quick -o PATH)" >&2
  exit 2
fi
python3 - "$profile" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])).get("memory") or {}
if m.get("prefill") is None:
    sys.exit(f"{sys.argv[1]}: no memory model (calibrated before peak memory was measured); calibrate again")
EOF
mkdir -p runs/memory
out=runs/memory/confirm-memory-$(date +%H%M%S).json
date
pdsim confirm --profile "$profile" --trace tinyllm --num-seqs 4 --min-in 200 --max-in 460 \
  --min-out 8 --max-out 8 --policy chunked --budget 16 64 256 --batch-size 1 4 --repeats "$repeats" -o "$out"
date
python3 - "$profile" "$out" <<'EOF'
import json, statistics, sys
prof, rep = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
w = prof["memory"]["weights_bytes"] / 1e9
print(f"\npeak memory, {prof['model']['name']} ({prof['model']['dtype']}), weights {w:.3f} GB; predicted / measured median over "
      f"{rep['protocol']['repeats']} runs")
print("| setting | predicted GB | measured GB (min..max) | error | above weights: predicted / measured GB | error |")
print("|---|---:|---:|---:|---:|---:|")
errs, above = [], []
for r in rep["results"]:
    p, m = r["predicted"].get("peak_memory_gb"), r["measured"].get("peak_memory_gb")
    if p is None or m is None:
        print(f"| {r['label']} | - | - | - | - | - |")
        continue
    e, ea = (p - m["median"]) / m["median"], (p - m["median"]) / (m["median"] - w)
    errs.append(abs(e)); above.append(abs(ea))
    print(f"| {r['label']} | {p:.3f} | {m['median']:.3f} ({m['min']:.3f}..{m['max']:.3f}) | {e:+.1%} | "
          f"{p - w:.3f} / {m['median'] - w:.3f} | {ea:+.1%} |")
if errs:
    print(f"median |error|: {statistics.median(errs):.1%} (target <= 10%); above the weights: "
          f"{statistics.median(above):.1%}")
e = prof["memory"].get("errors", {})
for step in ("prefill", "decode"):
    if step in e:
        print(f"calibration, {step} rise: held out {e[step]['form_mean']:.1%}, cv {e[step]['cv_form_mean']:.1%}")
for r in e.get("runs", []):
    print(f"calibration engine run {r['name']} ({r['part']}): {r['predicted_bytes'] / 1e9:.3f} / "
          f"{r['measured_bytes'] / 1e9:.3f} GB ({r['rel_error']:+.1%})")
print(f"report: {sys.argv[2]}")
EOF
