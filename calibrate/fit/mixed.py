"""Fit vLLM's one forward per iteration (`sim.cost.model.MIXED_FORM`) to the grid's mixed
forwards, and say how well it predicts forwards it has not seen.

A mixed forward reads the weights once for every row's tokens (dense(T), T the call's tokens)
and attends row by row (c per query-key pair, d per cached token read, e per row). Two dense
parts compete, chosen by cross-validation over the grid's forwards: a line a + b*T, or a curve
through the measured T (a BLAS's kernels are far from linear at small sizes). Calls of held-out
engine runs are only priced (`replay`): predicted/measured by call size.

The projections and MLP run one matrix product over the forward's T rows, the kernels a prefill
chunk of T rows runs: rows beyond a multiple of the BLAS's tile run slower ones. Most of the grid's
mixed forwards are unaligned (as budgets' remainders are) while a forward that fills a budget of 32
is aligned, so the prefill fit's tile remainder (`sim.cost.curve.remainder_cost`, fitted on
aligned and unaligned chunks) is taken as known: dense(T) is fitted without it and the price adds
it back. On calibration E, vllm t32's forwards read 1.08 and 1.13 of their measured times
without it, 1.05 and 1.10 with it (its own samples refit); t512's (whole prompts) 1.01 either way.
The quick grids also time aligned forwards (`calibrate.measure.grid.ALIGNED`), which the fit sees.
"""
from __future__ import annotations

import random

import numpy as np

from calibrate.fit.common import FOLDS, knot_sizes, nnls, repeat_noise, size_folds
from sim.cost.copies import call_copies
from sim.cost.curve import Curve, remainder_cost
from sim.cost.model import MIXED_FORM
from sim.metrics.residuals import summarize


def _terms(s: dict) -> list[float]:
    """[attention pair terms, cached tokens read, rows] of a forward's rows."""
    chunks, prefixes = s["chunks"], s["prefixes"]
    return [sum(n * (p + n / 2) for n, p in zip(chunks, prefixes)), float(sum(prefixes)), float(len(chunks))]


Tiled = tuple[int, tuple[float, ...]]  # a tile and the remainder's prices (`sim.cost.curve.remainder_cost`)
NO_TILE: Tiled = (0, (0.0, 0.0))


def _tokens(s: dict) -> int:
    return sum(s["chunks"])


def _target(s: dict, copies) -> float:
    """Seconds of the forward itself: its own caches' growth priced as a prefill's copies."""
    return s["seconds"] - call_copies(copies, "prefill", 0, 0, s.get("written", 0), s.get("fresh", 0))


def fit(samples: list[dict], copies, curve: bool, tiled: Tiled = NO_TILE) -> tuple[np.ndarray, list[int]]:
    """NNLS coefficients: [a, b] or one weight per knot (`curve`), then c, d, e; and the knots."""
    sizes = sorted({_tokens(s) for s in samples})
    knots = knot_sizes(sizes, 0) if curve else []
    rows = []
    for s in samples:
        dense = [Curve(tuple(knots), tuple(float(i == k) for i in range(len(knots))))(_tokens(s))
                 for k in range(len(knots))] if curve else [1.0, float(_tokens(s))]
        rows.append(dense + _terms(s))
    y = np.array([_target(s, copies) - remainder_cost(_tokens(s), *tiled) for s in samples])
    return nnls(np.array(rows), np.array([s["seconds"] for s in samples]), y), knots


def predict(x: np.ndarray, knots: list[int], samples: list[dict], tiled: Tiled = NO_TILE) -> np.ndarray:
    out = []
    for s in samples:
        c, d, e = x[-3:]
        dense = Curve(tuple(knots), tuple(x[:len(knots)]))(_tokens(s)) if knots else x[0] + x[1] * _tokens(s)
        att, pre, rows = _terms(s)
        out.append(dense + remainder_cost(_tokens(s), *tiled) + c * att + d * pre + e * rows)
    return np.array(out)


def _errors(samples: list[dict], tests: list[set[int]], copies, curve: bool, tiled: Tiled) -> np.ndarray:
    err = np.zeros(len(samples))
    for test in tests:
        train = [s for i, s in enumerate(samples) if i not in test]
        x, knots = fit(train, copies, curve, tiled)
        held = [samples[i] for i in sorted(test)]
        pred = predict(x, knots, held, tiled)
        for i, p, s in zip(sorted(test), pred, held):
            err[i] = abs(p / _target(s, copies) - 1)
    return err


def fit_mixed(samples: list[dict], held_runs: list[dict], copies, seed: int = 0,
              tiled: Tiled = NO_TILE) -> dict | None:
    """The profile's `cost.mixed` section and its errors (None without mixed forwards to fit):
    a quarter of the grid's forwards held out of a fit, the form chosen by 4-fold cross-validation,
    and the held-out engine runs' forwards priced. `tiled`: the prefill fit's tile and remainder
    prices (tile 0: none)."""
    if len(samples) < 8:
        return None
    sizes = [_tokens(s) for s in samples]
    held = size_folds(sizes, random.Random(f"{seed}/mixed"))[0]
    folds = size_folds(sizes, random.Random(f"cv{seed}/mixed"))
    cv = {curve: _errors(samples, folds, copies, curve, tiled) for curve in (False, True)}
    curve = bool(cv[True].mean() < cv[False].mean())
    e_held = _errors(samples, [held], copies, curve, tiled)[sorted(held)]
    x, knots = fit(samples, copies, curve, tiled)
    section = {"form": MIXED_FORM, "coef": [float(x[0]) if not curve else 0.0, float(x[1]) if not curve else 0.0,
                                            *map(float, x[-3:])],
               **({"dense": [[float(k), float(v)] for k, v in zip(knots, x[:len(knots)])]} if curve else {}),
               **({"tiled": True} if tiled[0] else {})}  # the prefill's remainder added (`sim.cost.model`)
    errors = {"held_out": len(held), "train": len(samples) - len(held), "form_mean": float(e_held.mean()),
              "repeat_noise": repeat_noise(samples), "use": f"{'curve' if curve else 'line'} for dense(T)",
              "form_max": float(e_held.max()), "cv_folds": FOLDS, "cv_form_mean": float(cv[curve].mean()),
              "cv_form_max": float(cv[curve].max()), "cv_line_mean": float(cv[False].mean()),
              "cv_curve_mean": float(cv[True].mean())}
    for s, f in zip(samples, predict(x, knots, samples, tiled)):
        s["fitted"], s["held_out"] = float(f), False
    out = {"cost": section, "errors": errors}
    if held_runs:
        pred = predict(x, knots, held_runs, tiled)
        ratios = [(s["call"], s["bucket"], float(p / _target(s, copies))) for s, p in zip(held_runs, pred)]
        out["replay"] = {"calls": len(held_runs), "by_kind": summarize(ratios, by_size=False),
                         "by_size": summarize(ratios)}
    return out
