"""The figures `pdsim traces info` prints: how many requests, how fast, how bursty, how long.

Conventions, chosen so a figure means the same thing as the generator option of the same name:
- mean rate = (count - 1) / duration, i.e. 1 / the mean inter-arrival gap, which is the `rate` of
  the Poisson and gamma generators;
- cv2 = the squared coefficient of variation of the inter-arrival gaps, var / mean^2 (population
  variance): 1 for Poisson arrivals, above 1 burstier, 0 for evenly spaced ones;
- burstiness = 1 / cv2, the gamma shape with that variation: the generators' `burstiness`, which
  is vLLM's (`traces.generators.gamma_gaps`), so a trace made with `--burstiness 0.25` reads back
  close to 0.25, and a public trace's figure can be fed to the generator. Infinite for evenly
  spaced arrivals;
- length percentiles are nearest-rank (`sorted[ceil(q*n)-1]`, numpy's `inverted_cdf`, as the
  project's decode-gap figures), so each one is a length that occurs in the trace.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from sim.core.files import jsonable
from traces.trace import Trace

PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class Lengths:
    """Distribution of one length column, in tokens."""
    min: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    total: int


@dataclass(frozen=True)
class TraceStats:
    count: int
    duration_s: float  # last arrival minus first
    mean_rate: float  # requests/s, 1 / mean gap (nan with fewer than 2 requests or no time between them)
    cv2: float  # squared coefficient of variation of the gaps (nan with fewer than 2 gaps)
    burstiness: float  # 1 / cv2: the gamma shape, vLLM's convention (inf for evenly spaced arrivals)
    gap_p50_s: float
    gap_p99_s: float
    gap_max_s: float
    prompt: Lengths
    output: Lengths

    def to_dict(self) -> dict:
        """Plain values for JSON; an undefined or infinite figure becomes None, since JSON has neither."""
        return jsonable(asdict(self))


def nearest_rank(values: np.ndarray, q: float):
    return np.percentile(values, q * 100, method="inverted_cdf")


def lengths(values: np.ndarray) -> Lengths:
    p50, p90, p99 = (int(nearest_rank(values, q)) for q in PERCENTILES)
    return Lengths(int(values.min()), float(values.mean()), p50, p90, p99, int(values.max()), int(values.sum()))


def describe(trace: Trace) -> TraceStats:
    """The figures of a (non-empty) trace."""
    arrivals = np.fromiter((r.arrival for r in trace.requests), float, len(trace))
    prompts = np.fromiter((r.prompt_len for r in trace.requests), np.int64, len(trace))
    outputs = np.fromiter((r.output_len for r in trace.requests), np.int64, len(trace))
    gaps = np.diff(arrivals)
    duration = float(arrivals[-1] - arrivals[0])
    nan = math.nan
    mean_gap = float(gaps.mean()) if len(gaps) else nan
    rate = 1.0 / mean_gap if len(gaps) and mean_gap > 0 else nan
    cv2 = float(gaps.var() / mean_gap ** 2) if len(gaps) >= 2 and mean_gap > 0 else nan
    return TraceStats(
        count=len(trace), duration_s=duration, mean_rate=rate, cv2=cv2,
        burstiness=(1.0 / cv2 if cv2 > 0 else math.inf) if cv2 == cv2 else nan,
        gap_p50_s=float(nearest_rank(gaps, 0.5)) if len(gaps) else nan,
        gap_p99_s=float(nearest_rank(gaps, 0.99)) if len(gaps) else nan,
        gap_max_s=float(gaps.max()) if len(gaps) else nan,
        prompt=lengths(prompts), output=lengths(outputs))
