"""A run's predicted metrics: one replay at typical call times, or the median over noisy replays.

With a profile that measured its engine's call noise (`sim.cost.noise`), a run is replayed `replicas`
times, each call's time multiplied by a seeded draw, and every metric is the median over the
replays: a max gap is then the worst of the calls as they come, not of their typical times, and
a measured run's figure is compared with what a run typically shows. Replica i uses seed i, so
a prediction is the same every time it is made.
"""
from __future__ import annotations

import math
from statistics import median
from typing import Callable

from policies.base import Policy
from sim.cost.model import CostModel
from sim.cost.noise import CallNoise
from sim.cost.speed import MachineSpeed
from sim.engine.log import EventLog
from sim.metrics.scoring import log_class_metrics, score
from sim.replay import simulate
from traces.trace import Trace

REPLICAS = 15


def replays(trace: Trace, policy: Callable[[], Policy], cost: CostModel, noise: CallNoise | None = None,
            replicas: int = REPLICAS, warmup: Trace | None = None,
            speed: MachineSpeed = MachineSpeed()) -> tuple[list[EventLog], bool]:
    """The replays a prediction is made of, and whether they are noisy: `replicas` of them with
    the call noise (replica i seeded i), or one at typical call times. `policy` makes a fresh
    policy for each replay (a policy may keep a run's queue, and prices an `auto` budget's chunks
    at the calibration's speed, as the real engine's does). `speed`: the machine's speed against
    its calibration's (a confirm's probes, `calibrate.measure.speed_probe`): every call at its kind's."""
    cost = speed.of(cost)
    if noise is None or replicas < 1:
        return [simulate(trace, policy(), cost, warmup=warmup)], False
    return [simulate(trace, policy(), cost, warmup=warmup, noise=noise.sampler(i)) for i in range(replicas)], True


def predict(trace: Trace, policy: Callable[[], Policy], cost: CostModel, noise: CallNoise | None = None,
            replicas: int = REPLICAS, warmup: Trace | None = None,
            stall_ms: float = 100.0) -> tuple[dict, dict[str, tuple[float, float]]]:
    """Every metric of the run as predicted (`replays`, then `metrics_of`)."""
    return metrics_of(*replays(trace, policy, cost, noise, replicas, warmup), stall_ms=stall_ms)


def metrics_of(logs: list[EventLog], noisy: bool,
               stall_ms: float = 100.0) -> tuple[dict, dict[str, tuple[float, float]]]:
    """Every metric as predicted by these replays (NaN where no replay has one), and each metric's
    range (min, max) over them ({} for the one replay at typical times)."""
    if not noisy:
        return score(logs[0], stall_ms=stall_ms), {}
    runs = [score(log, stall_ms=stall_ms) for log in logs]
    out, spread = {}, {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r[k], (int, float)) and not math.isnan(r[k])]
        out[k] = median(vals) if vals else math.nan
        if vals:
            spread[k] = (min(vals), max(vals))
    return out, spread


def predict_classes(trace: Trace, policy: Callable[[], Policy], cost: CostModel, noise: CallNoise | None = None,
                    replicas: int = REPLICAS, warmup: Trace | None = None) -> dict[str, dict] | None:
    """Each priority class's figures (`sim.metrics.scoring.class_metrics`) as predicted (`replays`, then
    `classes_of`); None for a trace without classes."""
    if not any(r.cls is not None for r in trace.requests):
        return None
    return classes_of(trace, replays(trace, policy, cost, noise, replicas, warmup)[0])


def classes_of(trace: Trace, logs: list[EventLog]) -> dict[str, dict] | None:
    """Each priority class's figures as predicted by these replays: the median over them of every
    figure; None for a trace without classes."""
    if not any(r.cls is not None for r in trace.requests):
        return None
    runs = [log_class_metrics(trace, log) for log in logs]
    out = {}
    for cls, first in runs[0].items():
        out[cls] = {}
        for k in first:
            vals = [r[cls][k] for r in runs if not math.isnan(r[cls][k])]
            out[cls][k] = median(vals) if vals else math.nan
    return out
