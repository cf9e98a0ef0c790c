"""A distribution of one metric in bounded memory: exact while small, a stated error beyond.

Why: a week-long trace makes hundreds of millions of engine calls and inter-token gaps; holding
them all to take a percentile costs gigabytes. A `Distribution` keeps every value while it holds
at most `cap` of them (the figures are then exactly numpy's over the same values), and beyond
that folds them into a log-bucket histogram (DDSketch's mapping) whose quantiles are within a
relative error `alpha` of the exact ones: every value in a bucket lies within `alpha` of the
bucket's representative. Count, sum, mean, standard deviation, minimum and maximum stay exact
(to float rounding) at any size; only quantiles (percentiles, medians) are estimated.
"""
from __future__ import annotations

import math

import numpy as np

CAP = 1 << 20  # values held exactly: 8 MiB each (a million calls' worth)
ALPHA = 1e-3  # relative error of a quantile once a distribution outgrows CAP (0.1%)
PENDING = 1 << 16  # bucket keys held before they are counted into the sketch


class Distribution:
    def __init__(self, cap: int = CAP, alpha: float = ALPHA) -> None:
        self.cap, self.alpha = cap, alpha
        self._held: list[np.ndarray] = []  # exact values while n <= cap
        self._n = 0
        self._sketch: dict[int, int] | None = None  # bucket -> count, once past cap
        self._keys: list[np.ndarray] = []  # buckets of values folded since the sketch last counted them
        self._pending = 0
        self._zeros = 0
        self._gamma = (1 + alpha) / (1 - alpha)
        self._log_gamma = math.log(self._gamma)
        self._mean = 0.0  # running moments (Chan et al.'s pairwise update), once past cap
        self._m2 = 0.0
        self._min, self._max = math.inf, -math.inf

    # ---- adding ----------------------------------------------------------------------------

    def add(self, values) -> None:
        v = np.asarray(values, float).ravel()
        if not len(v):
            return
        self._min = min(self._min, float(v.min()))
        self._max = max(self._max, float(v.max()))
        if self._sketch is None:
            self._held.append(v)
            self._n += len(v)
            if self._n > self.cap:
                held, self._held, self._n = np.concatenate(self._held), [], 0
                self._sketch = {}
                self._fold(held)
            return
        self._fold(v)

    def _fold(self, v: np.ndarray) -> None:
        """Moments and buckets of `v` merged into the sketch's."""
        n, mean = len(v), float(v.mean())
        m2 = float(((v - mean) ** 2).sum())
        total = self._n + n
        delta = mean - self._mean
        self._mean += delta * n / total
        self._m2 += m2 + delta * delta * self._n * n / total
        self._n = total
        if (v < 0).any():
            raise ValueError("Distribution holds non-negative values (times, gaps, latencies)")
        pos = v[v > 0]
        self._zeros += n - len(pos)
        self._keys.append(np.ceil(np.log(pos) / self._log_gamma).astype(np.int64))
        self._pending += len(pos)
        if self._pending >= PENDING:
            self._count()

    def _count(self) -> None:
        """The buckets of the values folded since the last count, into the sketch (counted in bulk:
        a request's gaps one at a time spent most of a long replay's scoring in `np.unique`). The keys
        span a few thousand buckets, so counting them is a `bincount`, not a sort (the sort was 4.7% of
        `pdsim simulate` on the Azure 2023 conversation trace)."""
        if not self._keys:
            return
        keys = np.concatenate(self._keys)
        low = int(keys.min())
        counts = np.bincount(keys - low)
        keys = np.flatnonzero(counts)
        keys, counts = keys + low, counts[keys]
        self._keys, self._pending = [], 0
        sk = self._sketch
        for k, c in zip(keys.tolist(), counts.tolist()):
            sk[k] = sk.get(k, 0) + c

    # ---- reading ---------------------------------------------------------------------------

    @property
    def exact(self) -> bool:
        """Whether every figure is numpy's over the values themselves (no quantile estimated)."""
        return self._sketch is None

    def __len__(self) -> int:
        return self._n if self._sketch is not None else sum(map(len, self._held))

    def values(self) -> np.ndarray:
        """The values themselves, in the order added (only while exact)."""
        if self._sketch is not None:
            raise ValueError("the values were folded into a sketch")
        return np.concatenate(self._held) if self._held else np.zeros(0)

    def _flat(self) -> np.ndarray:
        if len(self._held) > 1:
            self._held = [np.concatenate(self._held)]
        return self._held[0] if self._held else np.zeros(0)

    def mean(self) -> float:
        if not len(self):
            return math.nan
        return float(self._flat().mean()) if self.exact else self._mean

    def std(self) -> float:
        """Population standard deviation, as numpy's and vLLM's."""
        if not len(self):
            return math.nan
        return float(self._flat().std()) if self.exact else math.sqrt(max(0.0, self._m2 / self._n))

    def max(self) -> float:
        return self._max if len(self) else math.nan

    def sum(self) -> float:
        if not len(self):
            return 0.0
        return float(self._flat().sum()) if self.exact else self._mean * self._n

    def percentile(self, q: float) -> float:
        """Linear interpolation between order statistics (numpy's default), q in [0, 1]."""
        n = len(self)
        if not n:
            return math.nan
        if self.exact:
            return float(np.percentile(self._flat(), q * 100))
        h = q * (n - 1)
        lo = math.floor(h)
        a, b = self._order(lo), self._order(min(lo + 1, n - 1))
        return a + (h - lo) * (b - a)

    def nearest_rank(self, q: float) -> float:
        """`sorted[ceil(q*n) - 1]`, numpy's inverted_cdf (the seeds' decode-gap percentiles)."""
        n = len(self)
        if not n:
            return math.nan
        if self.exact:
            return float(np.percentile(self._flat(), q * 100, method="inverted_cdf"))
        return self._order(max(0, math.ceil(q * n) - 1))

    def median(self) -> float:
        """numpy's median: the mean of the two middles of an even count."""
        n = len(self)
        if not n:
            return math.nan
        if self.exact:
            return float(np.median(self._flat()))
        return (self._order((n - 1) // 2) + self._order(n // 2)) / 2

    def _order(self, k: int) -> float:
        """The k-th smallest value (0-based), within `alpha` of the exact one; the extremes exact."""
        if k <= 0:
            return self._min
        if k >= self._n - 1:
            return self._max
        if k < self._zeros:
            return 0.0
        seen = self._zeros
        self._count()
        for key in sorted(self._sketch):
            seen += self._sketch[key]
            if seen > k:
                rep = 2 * self._gamma ** key / (self._gamma + 1)
                return min(max(rep, self._min), self._max)
        return self._max
