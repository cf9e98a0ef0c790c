"""Fit the cost model to measured step times, and say how well it predicts points it has not seen.

The forms (sim/costmodel.py) are linear in their coefficients: dense(n) is a curve through one
value per measured size (a hat-function basis), plus the attention terms. The fit is a
non-negative least squares on relative error: each row is divided by its measured time, so a 5 ms
decode counts as much as a 5 s prefill. Errors are reported two ways: on a seeded quarter of the
points per step held out from one fit, and by 4-fold cross-validation (every point held out once;
a steadier figure than a handful of points); both hold points out stratified by measured size.
Where interpolation over the grid cross-validates better than the form, and the form misses the
5% target, the profile says to use the grid.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import numpy as np
from scipy.optimize import lsq_linear

from sim.costmodel import DECODE_FORM, PREFILL_FORM, Curve, GridCostModel, LinearCostModel

TARGET = 0.05
FOLDS = 4  # cross-validation: every point held out once, predicted by a fit of the other three quarters


def _size(step: str, s: dict) -> int:
    """What the dense layers' cost depends on: rows through the weights."""
    return s["chunk"] if step == "prefill" else s["batch"]


def _attention(step: str, s: dict, knot: float, lone: bool) -> list[float]:
    """The physical terms besides dense(n): prefill c*L*(P + L/2) and d*P; decode
    batch*(c*min(x, knot) + e*max(0, x - knot)) for the longest context x, and with `lone`, a
    decode of one request its own slope (one column, zero for batches)."""
    if step == "prefill":
        return [s["chunk"] * (s["prefix"] + s["chunk"] / 2), s["prefix"]]
    x, b = _context_max(s), s["batch"]
    rows = [b * min(x, knot), b * max(0.0, x - knot)] if knot < np.inf else [b * x]
    if not lone:
        return rows
    return [0.0] * len(rows) + [x] if b == 1 else rows + [0.0]


def knot_of(samples: list[dict]) -> float:
    """Where a decode row's attention may change slope: the middle of the measured longest
    contexts, when the grid measures a stretch at least half as long beyond it (a slope fitted
    over less would be noise, and it prices every longer context); otherwise none (one slope)."""
    xs = sorted({round(_context_max(s)) for s in samples})
    mid = xs[len(xs) // 2] if len(xs) >= 3 else np.inf
    return float(mid) if xs and xs[-1] >= 1.5 * mid else np.inf


@dataclass
class Form:
    """A fitted form: coef [a, b, c, d] for prefill and [a, b, c(, e)] for decode, a = b = 0 since
    the measured dense curve replaces a + b*n; the decode knot (inf: one slope) and lone slope."""
    step: str
    coef: list[float]
    dense: list[list[float]]
    knot: float = np.inf
    lone: float | None = None  # decode of one request: seconds per context token (None: as a batch row)

    def model(self) -> LinearCostModel:
        curve = Curve.from_pairs(self.dense)
        if self.step == "prefill":
            return LinearCostModel(tuple(self.coef), (0.0, 0.0, 0.0), prefill_dense=curve)
        return LinearCostModel((0.0, 0.0, 0.0, 0.0), tuple(self.coef), decode_dense=curve, decode_knot=self.knot,
                               decode_lone=self.lone)


def fit_form(step: str, samples: list[dict]) -> Form:
    """Non-negative least squares on relative error, over a hat basis for dense(n) and the attention terms."""
    sizes = sorted({_size(step, s) for s in samples})
    knot = knot_of(samples) if step == "decode" else np.inf
    lone = step == "decode" and 1 in sizes and len(sizes) > 1
    hats = [Curve(tuple(sizes), tuple(float(i == k) for i in range(len(sizes)))) for k in range(len(sizes))]
    X = np.array([[h(_size(step, s)) for h in hats] + _attention(step, s, knot, lone) for s in samples])
    y = np.array([s["seconds"] for s in samples])
    res = lsq_linear(X / y[:, None], np.ones(len(y)), bounds=(0, np.inf))
    dense = [[float(n), float(v)] for n, v in zip(sizes, res.x)]
    coef = [float(c) for c in res.x[len(sizes):]]
    return Form(step, [0.0, 0.0] + coef[:len(coef) - lone], dense, knot, coef[-1] if lone else None)


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
    return s["context_max"] if "context_max" in s else s["context_sum"] / s["batch"]


def fit_profile(samples: list[dict], seed: int = 0) -> dict:
    """The profile's `cost` and `fit` sections; marks held-out samples and fills in `fitted`."""
    by_step = {st: [s for s in samples if s["step"] == st] for st in ("prefill", "decode")}
    forms, errors = {}, {}
    for step, pts in by_step.items():
        if len(pts) < 4:
            raise ValueError(f"calibration has only {len(pts)} {step} points; need at least 4")
        sizes = [_size(step, p) for p in pts]
        held = _folds(sizes, random.Random(f"{seed}/{step}"))[0]  # a quarter, every size represented
        for i, p in enumerate(pts):
            p["held_out"] = i in held
        e_form, e_grid = _held_out_errors(step, pts, [held])
        cv_form, cv_grid = _held_out_errors(step, pts, _folds(sizes, random.Random(f"cv{seed}")))
        errors[step] = {"held_out": len(held), "train": len(pts) - len(held),
                        "form_mean": float(e_form.mean()), "form_max": float(e_form.max()),
                        "grid_mean": float(e_grid.mean()), "grid_max": float(e_grid.max()),
                        "cv_folds": FOLDS, "cv_form_mean": float(cv_form.mean()), "cv_form_max": float(cv_form.max()),
                        "cv_grid_mean": float(cv_grid.mean()), "cv_grid_max": float(cv_grid.max()),
                        "repeat_noise": repeat_noise(pts)}
        forms[step] = fit_form(step, pts)  # the final fit uses every point
    use = "fit"
    if any(e["cv_form_mean"] > TARGET and e["cv_grid_mean"] < e["cv_form_mean"] for e in errors.values()):
        use = "grid"
    med = lambda st: statistics.median([s["seconds"] for s in samples if s["step"] == st] or [0.0])
    cost = {
        "use": use,
        "prefill": {"form": PREFILL_FORM, "coef": forms["prefill"].coef, "dense": forms["prefill"].dense,
                    "grid": _grid_points("prefill", by_step["prefill"]).tolist()},
        "decode": {"form": DECODE_FORM, "coef": forms["decode"].coef, "dense": forms["decode"].dense,
                   **({"knot": forms["decode"].knot} if forms["decode"].knot < np.inf else {}),
                   **({"lone": forms["decode"].lone} if forms["decode"].lone is not None else {}),
                   "grid": _grid_points("decode", by_step["decode"]).tolist()},
        "iteration": med("overhead"),
        "join": fit_copy([s for s in samples if s["step"] == "join"]),
        "leave": fit_copy([s for s in samples if s["step"] == "leave"]),
    }
    for step, pts in by_step.items():
        for p, f in zip(pts, _predict(forms[step].model(), step, pts)):
            p["fitted"] = float(f)
    return {"cost": cost, "fit": {"errors": errors, "target": TARGET, "uses": use}}


def _folds(sizes: list[int], rng: random.Random) -> list[set[int]]:
    """`FOLDS` disjoint test sets covering every point once (k-fold cross-validation), stratified
    by measured size: each size's points are dealt across the folds, so no fit loses most of a
    size (with three lone decodes, two held out together left one to fix both its terms)."""
    order = list(range(len(sizes)))
    rng.shuffle(order)
    order.sort(key=lambda i: sizes[i])  # stable: shuffled within a size
    return [set(order[k::FOLDS]) for k in range(FOLDS)]


def _held_out_errors(step: str, pts: list[dict], tests: list[set[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Relative errors (form, grid interpolation) on each test set, each predicted by a fit of
    the other points only."""
    e_form, e_grid = [], []
    for held in tests:
        train = [p for i, p in enumerate(pts) if i not in held]
        test = [p for i, p in enumerate(pts) if i in held]
        lin = fit_form(step, train).model()
        e_form.append(_rel_errors(_predict(lin, step, test), test))
        e_grid.append(_rel_errors(_predict(_grid_model(step, lin, train), step, test), test))
    return np.concatenate(e_form), np.concatenate(e_grid)


def fit_copy(samples: list[dict]) -> list[float]:
    """Batch-cache rebuild cost, a + b*batch + c*batch*max(context) (non-negative, weighted)."""
    if not samples:
        return [0.0, 0.0, 0.0]
    X = np.array([[1.0, s["batch"], s["batch"] * _context_max(s)] for s in samples])
    y = np.array([s["seconds"] for s in samples])
    w = 1.0 / np.maximum(y, 1e-3)  # extra times can be ~0 (noise): weigh them as 1 ms
    res = lsq_linear(X * w[:, None], y * w, bounds=(0, np.inf))
    for s, f in zip(samples, X @ res.x):
        s["fitted"] = float(f)
    return [float(c) for c in res.x]


def repeat_noise(samples: list[dict]) -> float:
    """How far one timing lies from its point's median, on average (relative): the noise floor
    that held-out errors should be read against."""
    dev = [abs(t - s["seconds"]) / s["seconds"] for s in samples for t in s.get("times", ()) if s["seconds"] > 0]
    return float(np.mean(dev)) if dev else 0.0


def _grid_model(step: str, lin: LinearCostModel, train: list[dict]) -> GridCostModel:
    pts = _grid_points(step, train)
    dummy = np.array([[1, 0, 0], [2, 0, 0], [1, 1, 0]], float)
    return GridCostModel(lin, pts if step == "prefill" else dummy, pts if step == "decode" else dummy)
