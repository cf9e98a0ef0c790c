"""Which calls of confirmed runs faulted fresh pages in, and what each faulted page cost.

Confirm runs keep each call's minor page faults (`EventLog.faults`, since stop 34). This prices
every call with the report's profile, at the run's own speed (the median over its calls of
predicted/measured), and prints per call kind: the calls that faulted at least 1 MiB
(`sim.residuals.FAULTED`), the MB they faulted, their pred/meas, and their time beyond the price
per faulted 4 KiB page; beside it, pred/meas of the calls that did not fault. This is the data
a model that predicts faults (not yet in pdsim) has to fit. Prints figures; asserts nothing.

    python3 benchmarks/fault_table.py PROFILE.json REPORT.json [REPORT.json ...]
"""
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.costmodel import ProfileError, cost_model, load_profile  # noqa: E402
from sim.errors import UserError  # noqa: E402
from sim.files import read_json_object  # noqa: E402
from sim.log import EventLog  # noqa: E402
from sim.residuals import FAULTED, call_kind, price_call  # noqa: E402

PAGE = 4096


def rows(report: dict, cost) -> dict[str, dict[str, list]]:
    """Per call kind: the faulted calls' (MB, pred/meas, us beyond price per page) and the others' pred/meas."""
    speed = {(r["label"], s["repeat"]): s["pred_over_meas"] for r in report["results"] for s in r.get("run_speed", ())}
    out: dict[str, dict[str, list]] = defaultdict(lambda: {"faulted": [], "clean": []})
    for run in report["runs"]:
        log = EventLog.from_dict(run["log"])
        at = speed.get((run["label"], run["repeat"])) or 1.0
        for c, n in zip(log.calls, log.faults or ()):
            if c.kind == "preempt" or c.end <= c.start:
                continue
            measured, priced = c.end - c.start, price_call(cost, c) / at
            kind = call_kind(c)
            if n >= FAULTED:
                out[kind]["faulted"].append((n * PAGE / 1e6, priced / measured, (measured - priced) / n * 1e6))
            else:
                out[kind]["clean"].append(priced / measured)
    return out


def main(profile: str, reports: list[str]) -> None:
    cost = cost_model(load_profile(profile))
    kinds: dict[str, dict[str, list]] = defaultdict(lambda: {"faulted": [], "clean": []})
    for path in reports:
        report = read_json_object(path, "confirm report", UserError)
        if not isinstance(report.get("runs"), list) or not isinstance(report.get("results"), list):
            raise UserError(f"confirm report {path}: no runs and results (is it a `pdsim confirm` report?)")
        for kind, got in rows(report, cost).items():
            kinds[kind]["faulted"] += got["faulted"]
            kinds[kind]["clean"] += got["clean"]
    med = lambda xs: f"{statistics.median(xs):.2f}" if xs else "-"  # noqa: E731
    print("| call kind | calls | faulted >1 MiB | MB faulted (median, max) | their pred/meas | "
          "us beyond price per page (median) | the others' pred/meas |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for kind, got in sorted(kinds.items()):
        f = got["faulted"]
        mb = f"{statistics.median(x[0] for x in f):.0f}, {max(x[0] for x in f):.0f}" if f else "-"
        print(f"| {kind} | {len(f) + len(got['clean'])} | {len(f)} | {mb} | {med([x[1] for x in f])} | "
              f"{med([x[2] for x in f])} | {med(got['clean'])} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    try:
        main(sys.argv[1], sys.argv[2:])
    except (UserError, ProfileError) as e:  # a missing or malformed file, or not a report
        print(f"fault_table: {e}", file=sys.stderr)
        sys.exit(2)
