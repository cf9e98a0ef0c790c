"""The KV copy prices a calibration fits: per token-row written (a join's pad and concatenation,
a leave's gather), and per row of fresh memory, from the grid's sync points and the engine runs'
calls (`sim.cost.copies` prices them in a replay)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import least_squares, lsq_linear

from calibrate.fit.common import context_max, is_single, nnls
from sim.cost.copies import call_copies, is_gather, is_step_growth


@dataclass(frozen=True)
class Copies:
    """What rebuilding KV buffers costs: seconds per token-row written (by a leave's gather, at
    its own price: `sim.cost.copies.is_gather`) and, more, per fresh one; a constant per sync in
    which requests join (leave) the batch cache."""
    copy: float = 0.0
    fresh: float = 0.0
    join: float = 0.0
    leave: float = 0.0
    gather: float | None = None  # None: a gather costs `copy` (fits without sync samples)
    fresh_step: float | None = None  # per fresh row of a step's own growth (None: `fresh`)
    grow: float | None = None  # per row a decode's own growth writes (None: `copy`)
    grow_single: float | None = None  # per row a single decode's own growth writes (None: `grow`)

    def of(self, s: dict) -> float:
        return (kv_seconds(self, s)
                + self.join * (s.get("joined", 0) > 0) + self.leave * (s.get("left", 0) > 0))


def is_gather_sample(s: dict) -> bool:
    return is_gather(s["step"], s.get("joined", 0), s.get("left", 0))


def is_step_growth_sample(s: dict) -> bool:
    return is_step_growth(s["step"], s.get("joined", 0), s.get("left", 0))


def is_single_growth(s: dict) -> bool:
    return s["step"] == "decode" and bool(s.get("written")) and is_single(s) and is_step_growth_sample(s)


def kv_seconds(prices, s: dict) -> float:
    """A sample's KV copies at `prices` (a cost model or `Copies`)."""
    return call_copies(prices, s["step"], s.get("joined", 0), s.get("left", 0), s.get("written", 0), s.get("fresh", 0),
                       is_single(s))


def copy_terms(s: dict, gather: bool = False) -> list[float]:
    """written (but a gather's), fresh, joined, left[, a gather's written]."""
    w, g = s.get("written", 0), gather and is_gather_sample(s)
    terms = [0 if g else w, s.get("fresh", 0), float(s.get("joined", 0) > 0), float(s.get("left", 0) > 0)]
    return terms + [w if g else 0] if gather else terms


def fit_copies(samples: list[dict]) -> Copies:
    """The price of the batch cache's rebuilds, from sync calls timed on their own: per token-row
    written and fresh, a constant per join and per leave, and per token-row a leave's gather
    writes (0 where no sync only left: then a gather costs `copy`).

    A robust fit (soft L1 on the log of predicted/measured, from the least-squares one): a sync
    that stalled (a leave of 2,660 rows at 502 ms where its neighbours ran 14-32 us a row) would
    otherwise set the price of every row. The log weighs a price 2x too high as much as one 2x too
    low; an error relative to either time alone is bounded on one side, and a fit to it priced
    this machine's leaves 8x what they ran.

    That fit is of the syncs that wrote no fresh rows (where there are a few), and a fresh row's
    price is then the median, over the syncs that wrote fresh rows, of each one's time beyond its
    price without them, per fresh row (as `fit_fresh_step`): what a fresh row costs scatters 2-5x
    from join to join (137-581 us in one calibration here), and one fit of all syncs leans on the
    large joins, which write thousands of fresh rows cheaply: it priced 372 us a fresh row where
    the median join paid 419 and confirm runs' fresh joins 450-650, and 53 us a warm row where the
    confirm runs' joins without fresh rows copied 23-35."""
    warm = [s for s in samples if not s.get("fresh")]
    base = warm if len(warm) >= 4 else samples
    X = np.array([copy_terms(s, gather=True) for s in base])
    y = np.array([s["seconds"] for s in base])
    x = nnls(X, y, y)
    used = np.abs(X).sum(axis=0) > 0
    if used.sum() < len(base):
        log_ratio = lambda v: np.log(np.maximum(X[:, used] @ v, 1e-3 * y) / y)
        x[used] = least_squares(log_ratio, x[used], bounds=(0, np.inf), loss="soft_l1", f_scale=0.1,
                                x_scale="jac").x
    copy, fresh, join, leave, gather = map(float, x)
    copies = Copies(copy, fresh, join, leave, gather if used[4] else None)
    dear = [s for s in samples if s.get("fresh")]
    if dear:
        copies = replace(copies, fresh=fresh_row_price(dear, copies))
    return copies


def fresh_row_price(dear: list[dict], copies: Copies) -> float:
    """Seconds a sync's fresh token-row costs beyond its copy, from the syncs that wrote some.
    Where they counted their page faults, two medians: faults per fresh row, times what a fault
    cost (each sync's time beyond its price without fresh rows, per fault). Else the median of
    that time per fresh row.

    Why two: a fresh row costs what its faults cost, and the two scatter apart. A calibration's
    fresh syncs fault 8-45 pages a row and pay 1.6-15 us a fault, but the medians held at 28-30
    faults a row and 10-11 us a fault in all of six calibrations, as in their confirm runs (33 a
    row, 10-11 us each). The median of the ratio lands wherever the cheap syncs fall: 183 us a row
    in one calibration where the others gave 273-315."""
    beyond = [(s["seconds"] - copies.of(dict(s, fresh=0)), s) for s in dear]
    if len(dear) >= 3 and all(s.get("faults") for s in dear):
        per_row = statistics.median(s["faults"] / s["fresh"] for s in dear)
        price = per_row * statistics.median(b / s["faults"] for b, s in beyond)
    else:
        price = statistics.median(b / s["fresh"] for b, s in beyond)
    return max(0.0, float(price))


def fit_copy(samples: list[dict]) -> list[float]:
    """Batch-cache rebuild cost, a + b*batch + c*batch*max(context) (non-negative, weighted), from
    the join and leave steps of profiles made before KV copies were priced; [] without any."""
    if not samples:
        return []
    X = np.array([[1.0, s["batch"], s["batch"] * context_max(s)] for s in samples])
    y = np.array([s["seconds"] for s in samples])
    w = 1.0 / np.maximum(y, 1e-3)  # extra times can be ~0 (noise): weigh them as 1 ms
    res = lsq_linear(X * w[:, None], y * w, bounds=(0, np.inf))
    for s, f in zip(samples, X @ res.x):
        s["fitted"] = float(f)
    return [float(c) for c in res.x]
