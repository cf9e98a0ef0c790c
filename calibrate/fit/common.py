"""What both engines' fits share: the accuracy target, cross-validation folds, non-negative
least squares, knots and tiles of a measured curve, and what a calibration says of its own
noise (the machine's speed round by round, the scatter of repeated timings)."""
from __future__ import annotations

import random

import numpy as np
from scipy.optimize import lsq_linear

from sim.cost.noise import measure as measure_noise

TARGET = 0.05
FOLDS = 4  # cross-validation: every point held out once, predicted by a fit of the other three quarters


def size_folds(sizes: list[int], rng: random.Random) -> list[set[int]]:
    """`FOLDS` disjoint test sets covering every point once (k-fold cross-validation), stratified
    by measured size: each size's points are dealt across the folds, so no fit loses most of a
    size (with three lone decodes, two held out together left one to fix both its terms)."""
    order = list(range(len(sizes)))
    rng.shuffle(order)
    order.sort(key=lambda i: sizes[i])  # stable: shuffled within a size
    return [set(order[k::FOLDS]) for k in range(FOLDS)]


def knot_sizes(sizes: list[int], tile: int) -> list[int]:
    """Sizes the dense curve passes through: every measured size, or with a tile only the
    multiples of it (and the ends), so the remainder terms carry what is unaligned."""
    if not tile:
        return sizes
    return sorted({s for s in sizes if s % tile == 0} | {sizes[0], sizes[-1]})


def nnls(X: np.ndarray, y: np.ndarray, y_fit: np.ndarray, rounds: int = 4) -> np.ndarray:
    """Non-negative least squares on relative error, the error relative to the prediction (each
    row divided by the fitted time, refitted a few times from the measured one): dividing by the
    measured time instead favours the calls that ran fast, and fits noisy costs low (KV copies,
    whose page faults vary 30%: 14-17% low). A term no sample exercises stays 0."""
    used = np.abs(X).sum(axis=0) > 0
    x = np.zeros(X.shape[1])
    if not used.any():
        return x
    scale = y
    for _ in range(rounds):
        x[used] = lsq_linear(X[:, used] / scale[:, None], y_fit / scale, bounds=(0, np.inf)).x
        scale = np.maximum(X @ x + (y - y_fit), 0.1 * y)  # the predicted time (known terms included), kept > 0
    return x


def remainder_terms(L: int, tile: int) -> list[float]:
    """A chunk's rows beyond its last whole tile run slower kernels: [any at all, how many, and
    the chunk's rows if any] (`sim.cost.curve.remainder_cost`)."""
    r = L % tile if tile else 0
    return [float(r > 0), float(r), float(L) * (r > 0)] if tile else []


def best_tile(errors) -> int:
    """Of `TILES`, the one whose cross-validated errors (`errors(tile)`, an array) are lowest on
    average, if it beats no tile by `TILE_MARGIN`; else 0."""
    errs = {t: float(errors(t).mean()) for t in TILES}
    best = min(errs, key=errs.get)
    return best if errs[0] - errs[best] > TILE_MARGIN else 0


def grid_sizes(sizes: list[int], samples: list[dict]) -> list[int]:
    """The sizes a dense curve's knots sit at: the grid's points' (medians over rounds), not an
    engine run's one-off call's; every size where no sample is the grid's (`sizes[i]` is
    `samples[i]`'s)."""
    grid = {n for n, s in zip(sizes, samples) if "source" not in s}
    return sorted(grid or set(sizes))


def knot_of(samples: list[dict]) -> float:
    """Where a decode row's attention may change slope: the middle of the measured longest
    contexts, when the grid measures a stretch at least half as long beyond it (a slope fitted
    over less would be noise, and it prices every longer context); otherwise none (one slope)."""
    xs = sorted({round(context_max(s)) for s in samples if not is_single(s) and "source" not in s})  # the grid's
    mid = xs[len(xs) // 2] if len(xs) >= 3 else np.inf
    return float(mid) if xs and xs[-1] >= 1.5 * mid else np.inf


def noise_of(samples: list[dict], speeds: list[float]) -> dict:
    """The calls' own noise (`sim.cost.noise`), for predicting tails: {"noise": ...}, or {} when the
    grid repeated too few points to say."""
    noise = measure_noise(samples, speeds)
    return {"noise": noise.to_json()} if noise is not None else {}


def repeat_noise(samples: list[dict]) -> float:
    """How far one timing lies from its point's median, on average (relative): the noise floor
    that held-out errors should be read against."""
    dev = [abs(t - s["seconds"]) / s["seconds"] for s in samples for t in s.get("times", ()) if s["seconds"] > 0]
    return float(np.mean(dev)) if dev else 0.0


def speed_by_round(samples: list[dict]) -> list[float]:
    """Each round's timings over their points' medians (the median ratio): how fast the machine
    ran in that round. Rounds minutes apart differ by 10-20% on a shared VM; a calibration
    predicts the machine's average speed over its rounds, and a later run on a faster or slower
    machine misses by that much."""
    by: dict[int, list[float]] = {}
    for s in samples:
        for r, t in enumerate(s.get("times", ())):
            if s["seconds"] > 0:
                by.setdefault(r, []).append(t / s["seconds"])
    return [float(np.median(by[r])) for r in sorted(by)]
TILES = (0, 8, 16, 32)  # prefill tile candidates (0: none), chosen by cross-validation
TILE_MARGIN = 0.005  # a tile must cut the cross-validated error by half a point to beat the plain curve


def is_single(s: dict) -> bool:
    """A decode on the request's own cache (older samples say `batched`: False for batch 1)."""
    return bool(s.get("single", not s.get("batched", True)))


def context_max(s: dict) -> float:
    return s["context_max"] if "context_max" in s else s["context_sum"] / s["batch"]
HELD_OUT = "held-out:"  # the source of engine-run calls that are never fitted, only priced
ENGINE_CHOICE = 8  # engine-run samples needed to choose form or grid on them


def choose_use(samples: list[dict], cv_form: np.ndarray, cv_grid: np.ndarray) -> str:
    """"grid" where interpolating predicts better than the form, each sample held out in turn:
    judged on the calls the engine runs made (unaligned chunks, joins, growth), which the grid's
    aligned points cannot show; profiles without engine runs judge on the grid's points, and
    interpolate only where the form misses the target there."""
    engine = np.array(["source" in s for s in samples])
    if engine.sum() >= ENGINE_CHOICE:
        return "grid" if cv_grid[engine].mean() < cv_form[engine].mean() else "fit"
    form, grid = cv_form[~engine].mean(), cv_grid[~engine].mean()
    return "grid" if form > TARGET and grid < form else "fit"
