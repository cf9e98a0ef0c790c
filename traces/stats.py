"""The figures `pdsim traces info` prints: how many requests, how fast, how bursty, how long.

Conventions, chosen so a figure means the same thing as the generator option of the same name:
- mean rate = (count - 1) / duration, i.e. 1 / the mean inter-arrival gap, which is the `rate` of
  the Poisson and gamma generators;
- burstiness = the squared coefficient of variation of the inter-arrival gaps, var / mean^2
  (population variance). For gamma gaps this equals 1/shape, the generators' (and vLLM's)
  `burstiness`: 1 for Poisson, above 1 burstier, 0 for evenly spaced arrivals. So a trace made with
  `--burstiness 4` reads back close to 4, and a public trace's figure can be fed to the generator.
- length percentiles are nearest-rank (`sorted[ceil(q*n)-1]`, as the project's decode-gap figures),
  so each one is a length that occurs in the trace.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

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
    burstiness: float  # squared coefficient of variation of the gaps (nan with fewer than 2 gaps)
    gap_p50_s: float
    gap_p99_s: float
    gap_max_s: float
    prompt: Lengths
    output: Lengths

    def to_dict(self) -> dict:
        """Plain values for JSON; an undefined figure (NaN) becomes None, since JSON has no NaN."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}


def nearest_rank(sorted_values: np.ndarray, q: float):
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def lengths(values: np.ndarray) -> Lengths:
    v = np.sort(values)
    p50, p90, p99 = (int(nearest_rank(v, q)) for q in PERCENTILES)
    return Lengths(int(v[0]), float(v.mean()), p50, p90, p99, int(v[-1]), int(v.sum()))


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
    burst = float(gaps.var() / mean_gap ** 2) if len(gaps) >= 2 and mean_gap > 0 else nan
    g = np.sort(gaps)
    return TraceStats(
        count=len(trace), duration_s=duration, mean_rate=rate, burstiness=burst,
        gap_p50_s=float(nearest_rank(g, 0.5)) if len(g) else nan,
        gap_p99_s=float(nearest_rank(g, 0.99)) if len(g) else nan,
        gap_max_s=float(g[-1]) if len(g) else nan,
        prompt=lengths(prompts), output=lengths(outputs))
