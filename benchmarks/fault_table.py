"""Which calls of confirmed runs faulted fresh pages in, and what each faulted page cost.

Confirm runs keep each call's minor page faults (`EventLog.faults`, since stop 34). This prices
every call with the report's profile, at the run's own speed (the median over its calls of
predicted/measured), and prints per call kind: the calls that faulted at least 1 MiB
(`sim.metrics.residuals.FAULTED`), the MB they faulted, their pred/meas, and their time beyond the price
per faulted 4 KiB page; beside it, pred/meas of the calls that did not fault. A second table
splits each kind by whether the state machine expected fresh memory (`Call.fresh`, what the
cost model prices) and whether the call faulted: the data a model that predicts faults (not yet
in pdsim) has to fit. Prints figures; asserts nothing.

    python3 benchmarks/fault_table.py PROFILE.json REPORT.json [REPORT.json ...]
"""
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cost.profile import cost_model, load_profile
from sim.cost.fields import ProfileError  # noqa: E402
from sim.core.errors import UserError  # noqa: E402
from sim.core.inputs import read_json_object  # noqa: E402
from sim.engine.log import EventLog  # noqa: E402
from sim.metrics.residuals import FAULTED, call_kind, price_call, timed_calls  # noqa: E402

PAGE = 4096


@dataclass
class Priced:
    """One real call: its kind, whether the state machine expected fresh memory (`Call.fresh`),
    the MB it faulted, and predicted/measured at its run's own speed."""
    kind: str
    expected: bool
    mb: float
    ratio: float
    beyond_us_per_page: float  # its time beyond its price per faulted page (0 faults: 0)

    @property
    def faulted(self) -> bool:
        return self.mb * 1e6 / PAGE >= FAULTED


def priced_calls(report: dict, cost) -> list[Priced]:
    """Every timed call of the report's runs, priced (`rows` of the tables below)."""
    speed = {(r["label"], s["repeat"]): s["pred_over_meas"] for r in report["results"] for s in r.get("run_speed", ())}
    out = []
    for run in report["runs"]:
        log = EventLog.from_dict(run["log"])
        at = speed.get((run["label"], run["repeat"])) or 1.0
        if log.faults is None:  # a run from before stop 34
            continue
        for c, n in timed_calls(log):
            measured, priced = c.end - c.start, price_call(cost, c) / at
            out.append(Priced(call_kind(c), c.fresh > 0, n * PAGE / 1e6, priced / measured,
                              (measured - priced) / n * 1e6 if n else 0.0))
    return out


def median(xs: list[float], digits: int = 2) -> str:
    return f"{statistics.median(xs):.{digits}f}" if xs else "-"


def main(profile: str, reports: list[str]) -> None:
    cost = cost_model(load_profile(profile))
    calls: list[Priced] = []
    for path in reports:
        report = read_json_object(path, "confirm report", UserError)
        if not isinstance(report.get("runs"), list) or not isinstance(report.get("results"), list):
            raise UserError(f"confirm report {path}: no runs and results (is it a `pdsim confirm` report?)")
        calls += priced_calls(report, cost)
    print("| call kind | calls | faulted >1 MiB | MB faulted (median, max) | their pred/meas | "
          "us beyond price per page (median) | the others' pred/meas |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for kind in sorted({c.kind for c in calls}):
        of = [c for c in calls if c.kind == kind]
        f = [c for c in of if c.faulted]
        mb = f"{median([c.mb for c in f], 0)}, {max(c.mb for c in f):.0f}" if f else "-"
        print(f"| {kind} | {len(of)} | {len(f)} | {mb} | {median([c.ratio for c in f])} | "
              f"{median([c.beyond_us_per_page for c in f])} | {median([c.ratio for c in of if not c.faulted])} |")
    print("\n| call kind | fresh expected | faulted >1 MiB | calls | pred/meas median (p10) | MB faulted (median) |")
    print("|---|---|---|---:|---:|---:|")
    groups = defaultdict(list)
    for c in calls:
        groups[(c.kind, c.expected, c.faulted)].append(c)
    for (kind, expected, faulted), got in sorted(groups.items()):
        if any(k == kind and (e or f) for k, e, f in groups):  # kinds the estimate or the kernel says meet fresh memory
            ratios = sorted(c.ratio for c in got)
            print(f"| {kind} | {'yes' if expected else 'no'} | {'yes' if faulted else 'no'} | {len(got)} | "
                  f"{median(ratios)} ({ratios[len(ratios) // 10]:.2f}) | {median([c.mb for c in got], 0)} |")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(sys.argv[1], sys.argv[2:])
    except (UserError, ProfileError) as e:  # a missing or malformed file, or not a report
        print(f"fault_table: {e}", file=sys.stderr)
        sys.exit(2)
