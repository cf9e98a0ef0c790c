"""Which rule for fresh memory tells the page faults of measured calls (HISTORY, stop 40).

Two checkouts' state machines relog the same confirm reports (`calibrate.measure.engine_runs.relogged`), each
call's `fresh` by each checkout's rule, and each call's measured faults (`EventLog.faults`, in
token-rows of 56 pages, Qwen3-0.6B's). Printed per call kind, for each checkout's rule and for
combinations of the two: rows predicted and faulted, faulted/predicted over the calls predicted
fresh (p10, p50, p90: a price per fresh row needs it tight), and the rows faulted where the rule
said none. Prints figures; asserts nothing.

    python3 benchmarks/fresh_rules.py BEFORE_CHECKOUT AFTER_CHECKOUT REPORT.json [REPORT.json ...]
"""
import collections
import json
import subprocess
import sys

ROW_PAGES = 56  # a Qwen3-0.6B token-row (229,376 bytes) in 4 KiB pages
FAULTED = 20  # token-rows: a call that faulted fewer is counted as not faulting

RELOG = '''
import json, sys
sys.path.insert(0, sys.argv[1])
from calibrate.measure.engine_runs import relogged
from traces.trace import Trace
rep = json.load(open(sys.argv[2]))
out = []
if rep.get("engine", {}).get("name") != "mlx-lm":
    trace = Trace.from_dicts(rep["trace"]["requests"], rep["trace"]["meta"])
    for r in rep["runs"]:
        log = relogged(trace, r["log"], r["setting"])
        out.append([(c.kind, c.joined, c.written, c.fresh, f, c.batched) for c, f in zip(log.calls, log.faults)])
print(json.dumps(out))
'''


def calls(checkout: str, report: str) -> list:
    done = subprocess.run([sys.executable, "-c", RELOG, checkout, report], capture_output=True, text=True)
    if done.returncode:
        print(f"fresh_rules.py: {checkout} could not relog {report}: {(done.stderr.strip().splitlines() or ['?'])[-1]}",
              file=sys.stderr)
        sys.exit(2)
    return json.loads(done.stdout)


def kind_of(kind: str, joined: int, batched: bool) -> str:
    if kind == "sync":
        return "join" if joined else "leave"
    return "single" if kind == "decode" and not batched else kind


RULES = {"before": lambda k, b, a: b, "after": lambda k, b, a: a}


def main(before: str, after: str, reports: list[str]) -> None:
    tab, ratios = collections.defaultdict(collections.Counter), collections.defaultdict(list)
    for report in reports:
        for run_b, run_a in zip(calls(before, report), calls(after, report)):
            for (kind, joined, written, fb, faults, batched), (*_, fa, _, _) in zip(run_b, run_a):
                rows = faults / ROW_PAGES
                if not written and rows < FAULTED:
                    continue
                k = kind_of(kind, joined, batched)
                for name, rule in RULES.items():
                    x, t = rule(k, fb, fa), tab[(k, name)]
                    t["calls"] += 1
                    t["faulted"] += rows
                    t["predicted"] += x
                    if x > FAULTED:
                        ratios[(k, name)].append(rows / x)
                    else:
                        t["missed"] += rows
    print(f"{'kind':7s} {'rule':7s} {'calls':>5s} {'predicted':>9s} {'faulted':>8s}  faulted/predicted p10..p50..p90  "
          f"faulted where predicted none")
    for (k, name), t in sorted(tab.items()):
        r = sorted(ratios[(k, name)])
        q = (lambda f: f"{r[min(len(r) - 1, int(f * len(r)))]:.2f}") if r else (lambda f: "-")
        print(f"{k:7s} {name:7s} {t['calls']:5d} {t['predicted']:9.0f} {t['faulted']:8.0f}  "
              f"{q(0.1):>5s}..{q(0.5)}..{q(0.9)} ({len(r)} calls){'':6s} {t['missed']:.0f}")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        print("usage: python3 benchmarks/fresh_rules.py BEFORE_CHECKOUT AFTER_CHECKOUT REPORT.json [REPORT.json ...]",
              file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
