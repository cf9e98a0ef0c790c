"""Fit the cost model to measured step times, and say how well it predicts points it has not seen.

The forms (sim/costmodel.py) are linear in their coefficients, so the fit is a non-negative least
squares on relative error: each row is divided by its measured time, so a 5 ms decode counts as
much as a 5 s prefill. A seeded quarter of the points per step is held out; the errors reported
are on those. Where interpolation over the grid predicts the held-out points better than the form
(and the form misses the 5% target), the profile says to use the grid.
"""
from __future__ import annotations

import random
import statistics

import numpy as np
from scipy.optimize import lsq_linear

from sim.costmodel import DECODE_FORM, PREFILL_FORM, GridCostModel, LinearCostModel, decode_features, prefill_features

TARGET = 0.05


def _features(step: str, samples: list[dict]) -> np.ndarray:
    if step == "prefill":
        return prefill_features([s["chunk"] for s in samples], [s["prefix"] for s in samples])
    return decode_features([s["batch"] for s in samples], [_context_max(s) for s in samples])


def fit_form(step: str, samples: list[dict]) -> list[float]:
    X = _features(step, samples)
    y = np.array([s["seconds"] for s in samples])
    res = lsq_linear(X / y[:, None], np.ones(len(y)), bounds=(0, np.inf))
    return [float(c) for c in res.x]


def _grid_points(step: str, samples: list[dict]) -> np.ndarray:
    if step == "prefill":
        return np.array([[s["chunk"], s["prefix"], s["seconds"]] for s in samples], float)
    return np.array([[s["batch"], _context_max(s), s["seconds"]] for s in samples], float)


def _rel_errors(pred: np.ndarray, samples: list[dict]) -> np.ndarray:
    y = np.array([s["seconds"] for s in samples])
    return np.abs(pred - y) / y


def _predict(model, step: str, samples: list[dict]) -> np.ndarray:
    if step == "prefill":
        return np.array([model.prefill(s["chunk"], s["prefix"]) for s in samples])
    return np.array([model.decode(_contexts(s)) for s in samples])


def _contexts(s: dict) -> list[float]:
    """A batch with the sample's size and longest context: what the decode form depends on."""
    return [_context_max(s)] * s["batch"]


def _context_max(s: dict) -> float:
    return s.get("context_max", s["context_sum"] / s["batch"])


def fit_profile(samples: list[dict], seed: int = 0) -> dict:
    """The profile's `cost` and `fit` sections; marks held-out samples and fills in `fitted`."""
    rng = random.Random(seed)
    by_step = {st: [s for s in samples if s["step"] == st] for st in ("prefill", "decode")}
    coef, errors = {}, {}
    for step, pts in by_step.items():
        if len(pts) < 4:
            raise ValueError(f"calibration has only {len(pts)} {step} points; need at least 4")
        held = set(rng.sample(range(len(pts)), max(2, len(pts) // 4)))
        train = [p for i, p in enumerate(pts) if i not in held]
        test = [p for i, p in enumerate(pts) if i in held]
        for i, p in enumerate(pts):
            p["held_out"] = i in held
        c = fit_form(step, train)
        lin = _linear(step, c)
        grid = _grid_model(step, lin, train)
        e_form = _rel_errors(_predict(lin, step, test), test)
        e_grid = _rel_errors(_predict(grid, step, test), test)
        errors[step] = {"held_out": len(test), "train": len(train),
                        "form_mean": float(e_form.mean()), "form_max": float(e_form.max()),
                        "grid_mean": float(e_grid.mean()), "grid_max": float(e_grid.max())}
        coef[step] = fit_form(step, pts)  # final coefficients use every point
    use = "fit"
    if any(e["form_mean"] > TARGET and e["grid_mean"] < e["form_mean"] for e in errors.values()):
        use = "grid"
    med = lambda st: statistics.median([s["seconds"] for s in samples if s["step"] == st] or [0.0])
    cost = {
        "use": use,
        "prefill": {"form": PREFILL_FORM, "coef": coef["prefill"], "grid": _grid_points("prefill", by_step["prefill"]).tolist()},
        "decode": {"form": DECODE_FORM, "coef": coef["decode"], "grid": _grid_points("decode", by_step["decode"]).tolist()},
        "iteration": med("overhead"),
        "join": fit_copy([s for s in samples if s["step"] == "join"]),
        "leave": fit_copy([s for s in samples if s["step"] == "leave"]),
    }
    final = LinearCostModel(tuple(coef["prefill"]), tuple(coef["decode"]))
    for step, pts in by_step.items():
        for p, f in zip(pts, _predict(final, step, pts)):
            p["fitted"] = float(f)
    return {"cost": cost, "fit": {"errors": errors, "target": TARGET, "uses": use}}


def fit_copy(samples: list[dict]) -> list[float]:
    """Batch-cache rebuild cost, a + b*batch + c*batch*max(context) (non-negative, weighted)."""
    if not samples:
        return [0.0, 0.0, 0.0]
    X = decode_features([s["batch"] for s in samples], [_context_max(s) for s in samples])
    y = np.array([s["seconds"] for s in samples])
    w = 1.0 / np.maximum(y, 1e-3)  # extra times can be ~0 (noise): weigh them as 1 ms
    res = lsq_linear(X * w[:, None], y * w, bounds=(0, np.inf))
    for s, f in zip(samples, X @ res.x):
        s["fitted"] = float(f)
    return [float(c) for c in res.x]


def _linear(step: str, c: list[float]) -> LinearCostModel:
    zero = (0.0, 0.0, 0.0)
    return LinearCostModel(tuple(c), zero) if step == "prefill" else LinearCostModel(zero, tuple(c))


def _grid_model(step: str, lin: LinearCostModel, train: list[dict]) -> GridCostModel:
    pts = _grid_points(step, train)
    dummy = np.array([[1, 0, 0], [2, 0, 0], [1, 1, 0]], float)
    return GridCostModel(lin, pts if step == "prefill" else dummy, pts if step == "decode" else dummy)
