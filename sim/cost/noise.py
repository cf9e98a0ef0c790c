"""Call-time noise: how far one engine call lies from its typical time, as the engine showed it.

A cost model prices a call at its typical (median) time, and a replay at typical times predicts
typical aggregates well. A max gap or a p99 inter-token gap is the worst of hundreds of calls,
though, and on a real machine some calls stall: on the 2-vCPU VM pdsim is built on, one decode
in 50 takes 1.2-1.8x its neighbours (another tenant, a page fault, a timer), so a replay at
typical times predicts the worst gap 20-40% low, always low. The same holds, smaller, anywhere.

`measure` reads the distribution off the calibration: every grid point is timed once in each
round, so each timing over its point's median, after the round's speed (`speed_by_round`) is
divided out, is what the call's own luck added; shape and the machine's drift are gone. Each
round gives its own distribution and the median over rounds is kept: a round another process
disturbed (factors up to 2.8 where the quiet round's worst was 1.13) does not set the tails
(with the quick grid's two rounds, their mean: a disturbed round sets half of them).

Two timings of a point say less than each is worth: their median is their mean, so each lies
from it by half their difference, and a stall of 1.5x reads 1.2. A timing's own deviation from
its point's typical time is sqrt(2) times that (for independent timings; with three or more the
median stands in for the typical time within a few percent at the tails). So two-round ratios
are spread by sqrt(2) about 1: on a fresh mlx-lm calibration here (three rounds), any two of
its rounds read p95 1.05, p99 1.09 as they were and 1.08, 1.13-1.15 spread, where all three read
1.08, 1.17.

A prediction then replays a run several times (`sim.predict`), every call's time multiplied by a
factor drawn from it, and takes each metric's median over the replays.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import median
from typing import Callable, Iterable

POINTS = 41  # quantiles stored: probabilities 0, 1/40, ..., 1
MIN_CALLS = 60  # fewer timings than this say too little about a tail
NOISY = 1.3  # a p95 above this: other work ran in most rounds (quiet calibrations here: 1.14-1.17)
PAIR = math.sqrt(2)  # two timings' ratios to their mean, spread to a single timing's (the module's docstring)
FLOOR = 0.05  # no call runs in no time
DISTURBED = 1.10  # a calibration round this much slower than the others: timed again (quiet ones here: 1.02-1.04)


@dataclass(frozen=True)
class CallNoise:
    """The factor a call's time is multiplied by, as quantiles at evenly spaced probabilities
    (the first 0, the last 1), measured over `calls` calls."""
    quantiles: tuple[float, ...]
    calls: int

    def sampler(self, seed: int) -> Callable[[], float]:
        """Factors drawn from the distribution (inverse CDF, linear between quantiles); seeded."""
        rng, q = random.Random(seed), self.quantiles
        top = len(q) - 1

        def draw() -> float:
            u = rng.random() * top
            i = int(u)
            return q[i] + (q[i + 1] - q[i]) * (u - i)
        return draw

    def to_json(self) -> dict:
        return {"quantiles": list(self.quantiles), "calls": self.calls,
                "source": "the calibration's grid timings, each over its point's median, the round's speed divided out"}

    @staticmethod
    def from_json(doc: dict | None) -> "CallNoise | None":
        if not doc:
            return None
        return CallNoise(tuple(float(x) for x in doc["quantiles"]), int(doc["calls"]))

    def at(self, p: float) -> float:
        """The factor at probability p (for summaries)."""
        return _quantile(self.quantiles, p)


def ratios(samples: Iterable[dict], speeds: list[float]) -> list[list[float]]:
    """Each round's timings of the points timed in every round, each over its point's median,
    with each round's speed divided out; with two rounds, spread by `PAIR` about 1 (the module's
    docstring)."""
    out: list[list[float]] = [[] for _ in speeds]
    spread = PAIR if len(speeds) == 2 else 1.0
    for smp in samples:
        times = smp.get("times") or ()
        if len(times) != len(speeds) or len(times) < 2:
            continue
        own = [t / v for t, v in zip(times, speeds)]
        mid = median(own)
        if mid > 0:
            for r, t in enumerate(own):
                out[r].append(max(FLOOR, 1.0 + spread * (t / mid - 1.0)))
    return out


def measure(samples: Iterable[dict], speeds: list[float]) -> CallNoise | None:
    """The noise of the calibration's timings: each quantile the median over rounds of that
    round's quantile, so a round another process disturbed does not set the tails. None when the
    calibration repeated too few points to say."""
    rounds = [sorted(r) for r in ratios(samples, speeds)]
    if len(rounds) < 2 or sum(map(len, rounds)) < MIN_CALLS:
        return None
    q = [median(_quantile(r, k / (POINTS - 1)) for r in rounds) for k in range(POINTS)]
    return CallNoise(tuple(q), sum(map(len, rounds)))


def _quantile(xs: list[float], p: float) -> float:
    """Linear between order statistics of the sorted `xs` (numpy's default)."""
    u = p * (len(xs) - 1)
    i = min(int(u), len(xs) - 2)
    return xs[i] + (xs[i + 1] - xs[i]) * (u - i)
