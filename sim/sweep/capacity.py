"""Capacity: for each setting, the highest arrival rate at which it still meets every SLO.

A setting's metrics worsen as the same requests arrive faster (queues grow, TTFT and gaps with
them), so the rate it can serve under an SLO is a boundary, found by bisection on the trace's
arrival-rate scale: every round runs one point per setting still searching, on the sweep's own
executors (`sim.sweep.run.run_points`: local processes or a Dask cluster), and halves each
setting's bracket in log scale until its ends are within `tolerance` of each other. The answer is
the bracket's low end, a rate at which the setting was seen to meet the SLOs.

The range must bracket every answer: a setting that still meets the SLOs at its top, or a range
in whose bottom no setting meets them, is refused after the first round (two runs per setting),
not after hours. A setting that fails at the bottom while others pass serves less than the
range's bottom: its capacity is reported as below it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from policies.settings import setting_label, unique
from sim.core.errors import UserError
from sim.sweep.pick import Constraint
from sim.sweep.run import Inputs, Point, row_of, run_points
from traces.trace import Trace

TOLERANCE = 0.02  # a bracket this narrow (hi/lo - 1) is an answer: 2% of the rate
DEFAULT_RANGE = (0.05, 20.0)  # rate scales searched when none is given: 1/20x to 20x the trace's rate


class CapacityError(UserError, ValueError):
    """A search that cannot answer (a range that does not bracket, an SLO no rate meets)."""


def mean_rate(trace: Trace) -> float:
    """The trace's requests per second at rate scale 1: the arrivals' span over the requests."""
    reqs = trace.requests
    span = reqs[-1].arrival - reqs[0].arrival if len(reqs) > 1 else 0.0
    if span <= 0:
        raise CapacityError(f"trace {trace.meta.get('source', '')}: every request arrives at once, so it has no "
                            "arrival rate to scale (use a trace with arrivals spread in time)")
    return (len(reqs) - 1) / span


def meets(metrics: dict, constraints: list[Constraint]) -> bool:
    """Whether a run's metrics meet every constraint (an unmeasured metric meets none)."""
    return all(holds(metrics.get(c.metric), c) for c in constraints)


def holds(value, c: Constraint) -> bool:
    """Whether one metric's value meets one constraint (an unmeasured value meets none)."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return {"<=": value <= c.bound, ">=": value >= c.bound, "<": value < c.bound, ">": value > c.bound}[c.op]


@dataclass
class Search:
    """One setting's bracket: `lo` met every SLO (or is the range's bottom, not yet run), `hi` broke one."""
    setting: dict
    lo: float
    hi: float
    met_lo: bool | None = None
    met_hi: bool | None = None
    runs: list[tuple[float, dict]] = field(default_factory=list)  # (rate scale, metrics), in the order run

    def done(self, tolerance: float) -> bool:
        return self.met_lo is False or self.hi / self.lo <= 1 + tolerance

    def next_scale(self) -> float:
        return math.sqrt(self.lo * self.hi)


def search(settings: list[dict], trace_name: str, inputs: Inputs, constraints: list[Constraint],
           scales: tuple[float, float] = DEFAULT_RANGE, tolerance: float = TOLERANCE, workers: int | None = None,
           scheduler=None, progress: bool = True) -> list[Search]:
    """Each setting's bracket after the search (`Search.lo` its capacity's scale)."""
    lo, hi = scales
    if not (0 < lo < hi and math.isfinite(hi)):
        raise CapacityError(f"--rate-range {lo:g}:{hi:g}: expected 0 < LOW < HIGH (rate scales)")
    if not constraints:
        raise CapacityError("capacity needs at least one SLO to hold (--slo METRIC<=X)")
    found = [Search(s, lo, hi) for s in unique(settings)]  # complete, each once
    _round(found, [(f, f.lo) for f in found] + [(f, f.hi) for f in found], trace_name, inputs, constraints, workers,
           scheduler, progress)
    _check_bracket(found, trace_name, inputs, constraints)
    while True:
        todo = [f for f in found if not f.done(tolerance)]
        if not todo:
            return found
        _round(found, [(f, f.next_scale()) for f in todo], trace_name, inputs, constraints, workers, scheduler,
               progress)


def _round(found: list[Search], asks: list[tuple[Search, float]], trace_name: str, inputs: Inputs,
           constraints: list[Constraint], workers, scheduler, progress: bool) -> None:
    """Run one point per (setting, scale) asked, in parallel, and narrow each bracket."""
    points = [Point(f.setting, trace_name, scale) for f, scale in asks]
    results = run_points(points, inputs, workers, scheduler, False, progress)
    for (f, scale), (metrics, _) in zip(asks, results):
        f.runs.append((scale, metrics))
        ok = meets(metrics, constraints)
        if scale == f.lo and f.met_lo is None:
            f.met_lo = ok
        elif scale == f.hi and f.met_hi is None:
            f.met_hi = ok
        elif ok:
            f.lo = scale
        else:
            f.hi = scale


def _check_bracket(found: list[Search], trace_name: str, inputs: Inputs, constraints: list[Constraint]) -> None:
    rate = mean_rate(inputs.traces[trace_name])
    slo = " and ".join(map(str, constraints))
    top = [f for f in found if f.met_hi]
    if top:
        raise CapacityError(f"the rate range does not bracket the capacity of {setting_label(top[0].setting)}: it "
                            f"still meets {slo} at {top[0].hi * rate:.4g} requests/s (rate scale {top[0].hi:g}); "
                            "raise the range's top (--rate-range LOW:HIGH)")
    if not any(f.met_lo for f in found):
        raise CapacityError(f"no setting meets {slo} even at {found[0].lo * rate:.4g} requests/s (rate scale "
                            f"{found[0].lo:g}, the range's bottom): lower it (--rate-range LOW:HIGH) or loosen the SLO")


def margin(metrics: dict, constraints: list[Constraint]) -> float:
    """How far a run's metrics stay inside the SLOs: the smallest relative distance to a bound
    (negative where one is broken), which breaks ties between settings of equal capacity."""
    out = math.inf
    for c in constraints:
        v = metrics.get(c.metric)
        if v is None or not math.isfinite(v):
            return -math.inf
        room = (c.bound - v) if c.op in ("<=", "<") else (v - c.bound)
        out = min(out, room / abs(c.bound) if c.bound else room)
    return out


def table(found: list[Search], trace_name: str, inputs: Inputs, constraints: list[Constraint]) -> pd.DataFrame:
    """One row per setting: its capacity (requests/s and rate scale; None below the range), the
    bracket's top, and its SLO margin at its capacity; most traffic first, ties by margin."""
    rate = mean_rate(inputs.traces[trace_name])
    rows = []
    for f in found:
        at = dict(f.runs).get(f.lo, {}) if f.met_lo else {}
        rows.append({"label": setting_label(f.setting), **f.setting,
                     "capacity_req_s": f.lo * rate if f.met_lo else None,
                     "capacity_scale": f.lo if f.met_lo else None,
                     "breaks_at_req_s": (f.hi if f.met_lo else f.lo) * rate,  # below the range: at its bottom
                     "slo_margin": margin(at, constraints) if f.met_lo else None, "runs": len(f.runs)})
    df = pd.DataFrame(rows)
    return df.sort_values(["capacity_req_s", "slo_margin"], ascending=False, na_position="last",
                          kind="stable").reset_index(drop=True)


def curve(found: list[Search], trace_name: str, inputs: Inputs) -> pd.DataFrame:
    """Every run of the search as a sweep row (the rate scale and requests/s with it): each SLO
    metric against the rate, setting by setting, for the report."""
    rate = mean_rate(inputs.traces[trace_name])
    rows = []
    for f in found:
        for scale, metrics in sorted(f.runs, key=lambda r: r[0]):
            row = row_of(Point(f.setting, trace_name, scale), inputs, metrics)
            row["rate_req_s"] = scale * rate
            rows.append(row)
    return pd.DataFrame(rows)
