"""What each single decode's own buffer growth (meTile's 256 -> 512) cost per page fault.

One line per such growth: in the profile's own engine runs, then in each confirm report's runs.
Each line has the growth's start in its run, its minor page faults, and its measured time. It
also has the time beyond its price without copies (the profile's, at the calibration's speed).
The last column is that time less a row's copy (`grow`) per row written, per fault: 2.5-4 us
where the guest reused pages it had just freed, 10-22 us where the host backed them (HISTORY,
stop 36). Prints figures; asserts nothing.

    python3 benchmarks/growth_faults.py PROFILE.json [REPORT.json ...]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.cost.profile import cost_model, load_profile
from sim.cost.fields import ProfileError  # noqa: E402
from sim.core.errors import UserError  # noqa: E402
from sim.core.inputs import read_json_object  # noqa: E402
from sim.engine.log import EventLog  # noqa: E402
from sim.cost.price import price  # noqa: E402


def growths(name: str, log: EventLog, cost) -> None:
    """Print the log's single decodes whose own cache grew."""
    row = cost.grow if cost.grow is not None else cost.copy
    for i, c in enumerate(log.calls):
        if c.kind != "decode" or c.batched or not c.written:
            continue
        faults = log.faults[i] if log.faults is not None else None
        took = c.end - c.start
        beyond = took - price(cost, c.kind, c.tokens, c.prefix, c.contexts, c.batched, c.joined, c.left, 0, 0)
        per = f"{(beyond - row * c.written) / faults * 1e6:.1f}" if faults else "-"
        print(f"| {name} | {c.start:.1f} s | {faults if faults is not None else '-'} | {took * 1e3:.0f} | "
              f"{beyond * 1e3:.0f} | {per} |")


def main(profile: str, reports: list[str]) -> None:
    prof = load_profile(profile)
    cost = cost_model(prof)
    print("| run | at | faults | ms | ms beyond its price without copies | us a fault, after the copy |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in prof.get("engine_runs") or ():
        growths(f"calibration {r['name']}", EventLog.from_dict(r["log"]), cost)
    for path in reports:
        report = read_json_object(path, "confirm report", UserError)
        if not isinstance(report.get("runs"), list):
            raise UserError(f"confirm report {path}: no runs (is it a `pdsim confirm` report?)")
        for run in report["runs"]:
            growths(f"{Path(path).stem} {run['label']} r{run['repeat']}", EventLog.from_dict(run["log"]), cost)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    try:
        main(sys.argv[1], sys.argv[2:])
    except (UserError, ProfileError) as e:  # a missing or malformed file, or not a report
        print(f"growth_faults: {e}", file=sys.stderr)
        sys.exit(2)
