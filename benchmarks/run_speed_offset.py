"""How far confirm runs ran from the speed their probes read: where `sim.cost.speed.RUN_DECODE` came from.

For every run of the confirm reports named (pdsim's engine, probes timed in place), its own speed
per kind (the median over its prefills, and over its steady decodes, of the calibration's price
over the time measured) against its probes' reading; in log scale, the run's speed less
`PROBE_WEIGHT` times the reading: the mean is what a prediction at the probes' speed misses by on
average (before `RUN_DECODE`), and a least-squares line says whether the weight still fits.
Each report is priced by its own profile (its recorded path, relative to the report or a parent).

    python3 benchmarks/run_speed_offset.py REPORT.json...
"""
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

from sim.cost.profile import cost_model, load_profile
from sim.engine.log import EventLog
from sim.metrics.residuals import call_kind, price_call
from sim.cost.speed import PROBE_WEIGHT


def profile_of(report: Path, recorded: str) -> Path | None:
    """The profile a report was scored with: its recorded path as given, or under a parent folder."""
    for base in (Path.cwd(), *report.parents):
        if (base / recorded).is_file():
            return base / recorded
    return None


def points(report: Path) -> dict[str, list[tuple[float, float]]]:
    """(log probe reading, log run speed) per kind, one pair a run."""
    try:
        doc = json.loads(report.read_text())
        doc["profile"]["path"], doc["results"], doc["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"run_speed_offset.py: {report}: not a confirm report ({type(e).__name__}: {e})", file=sys.stderr)
        sys.exit(2)
    path = profile_of(report, doc["profile"]["path"])
    out = {"prefill": [], "decode": []}
    if path is None:
        print(f"{report}: its profile {doc['profile']['path']} is not found; left out", file=sys.stderr)
        return out
    cost = cost_model(load_profile(path))
    for res in doc["results"]:
        runs = [r for r in doc["runs"] if r["label"] == res["label"]]
        for run, read in zip(runs, res["machine_speed"]["runs"]):
            if read.get("method") != "positional":
                continue
            calls = [c for c in EventLog.from_dict(run["log"]).calls if c.end > c.start]
            own = {"prefill": [c for c in calls if call_kind(c) == "prefill"],
                   "decode": [c for c in calls if call_kind(c) == "decode" and not c.joined and not c.left]}
            for kind, mine in own.items():
                if mine:
                    speed = statistics.median(price_call(cost, c) / (c.end - c.start) for c in mine)
                    out[kind].append((math.log(read[kind]), math.log(speed)))
    return out


def main(paths: list[str]) -> None:
    pooled = {"prefill": [], "decode": []}
    for p in paths:
        for kind, pts in points(Path(p)).items():
            pooled[kind] += pts
    for kind, pts in pooled.items():
        if len(pts) < 3:
            print(f"{kind}: {len(pts)} runs, too few")
            continue
        read, run = np.array(pts).T
        miss = run - PROBE_WEIGHT * read
        slope, intercept = np.polyfit(read, run, 1)
        print(f"{kind}: {len(pts)} runs; run over the speed predicted at (weight {PROBE_WEIGHT}): "
              f"mean {100 * miss.mean():+.2f}%, sd {100 * miss.std():.2f}%; "
              f"least squares: run = {100 * intercept:+.2f}% + {slope:.2f} x reading")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python3 benchmarks/run_speed_offset.py REPORT.json...", file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1:])
