"""Fit mlx-lm BatchGenerator's cost forms (`sim.cost.mlxlm.MlxLmCosts`) and say how well they predict.

Two steps, as in `calibrate.fit.pdsim`: the generation batch's calls first (steps, first forwards and
joins, the joins' and the engine runs' KV copies: a token-row written and a fresh one are priced
here), then the prompt calls with the copy prices known. Each is a non-negative least squares on
relative error over a hat basis for dense(n) (n = rows through the weights: the batch, or rows x
the longest chunk) and the attention terms; errors on a seeded quarter held out and by 4-fold
cross-validation, and the calls of held-out BatchGenerator runs priced by kind (`fit.replay`).
"""
from __future__ import annotations

import random
import statistics

import numpy as np

from calibrate.fit.common import (
    FOLDS,
    HELD_OUT,
    TARGET,
    best_tile,
    grid_sizes,
    knot_of,
    knot_sizes,
    nnls,
    noise_of,
    remainder_terms,
    repeat_noise,
    size_folds,
    speed_by_round,
)
from sim.cost.curve import Curve
from sim.cost.mlxlm import MLX_PROMPT_FORM, MLX_STEP_FORM, MlxLmCosts
from sim.cost.model import LinearCostModel
from sim.metrics.residuals import call_ratios, summarize


def _size(step: str, s: dict) -> int:
    return s["rows"] * s["chunk"] if step == "prompt" else s["batch"]


def _hats(sizes: list[int]) -> list[Curve]:
    return [Curve(tuple(sizes), tuple(float(i == k) for i in range(len(sizes)))) for k in range(len(sizes))]


def _terms(step: str, s: dict, knot: float, counted: bool = False) -> list[float]:
    """The physical terms besides dense(n): prompt rows*L*(idx + L) and rows*idx; a step
    batch*(c*min(x, knot) + e*max(0, x - knot)), a first forward's constant, KV copies, and
    where every call that writes counted them, its page faults."""
    if step == "prompt":
        return [s["rows"] * s["chunk"] * (s["idx"] + s["chunk"]), s["rows"] * s["idx"]]
    x, b = s["context_max"], s["batch"]
    att = [b * min(x, knot), b * max(0.0, x - knot)] if knot < np.inf else [b * x]
    faults = [s.get("faults", 0)] if counted else []
    return att + [float(bool(s.get("first"))), s.get("written", 0), s.get("fresh", 0)] + faults


def counts_faults(samples: list[dict]) -> bool:
    """Whether every sample that wrote KV rows counted its page faults (calibrations that predate
    fault counting did not, and there a grid merge's faults are priced as its rows' copy)."""
    return any(s.get("written") for s in samples) and all("faults" in s for s in samples if s.get("written"))


def fresh_by_faults(samples: list[dict], page: float, fitted: float) -> float:
    """A fresh token-row's price (`sim.engine.heap` says which rows are fresh): the median page faults
    per fresh row over the calls that met some, at `page` seconds a fault (`fitted`, the form's
    own price, where no call met any). Why: a row's faults cost what a fault costs, and both
    the rows a call writes and the rows it meets fresh are known per call. Priced instead at the
    average faults per row written, every first forward pays a first forward's faults, and the
    ones that fault nothing (most) ran at 1.11-1.23x predicted/measured in three rounds' confirm
    runs; priced per fresh row, at 0.96-1.05x."""
    met = [s["faults"] / s["fresh"] for s in samples if s.get("fresh") and s.get("faults")]
    return statistics.median(met) * page if met else fitted


def fit_step(step: str, samples: list[dict], copies: tuple[float, float] = (0.0, 0.0), tile: int = 0) -> MlxLmCosts:
    """One step's form; `copies` (per written, per fresh token-row) are known for prompt calls.
    dense(n) has knots at the grid's sizes only: a knot at every engine call's size fitted each
    one-off timing (qwen3-tiny: 8.7 ms at 18 rows between 4.2 and 4.0, 0 at 90). What an
    unaligned size costs beyond its neighbours goes to a prompt call's remainder terms instead
    (`tile`, as pdsim's prefill: qwen3-0.6b ran 31 rows in 720 ms and 32 in 624), and a prompt
    call's curve, through aligned sizes, never falls (its unknowns are the steps up from knot to
    knot: two rows of 16 were once priced below one). A generation batch's curve may fall
    (qwen3-0.6b: 7 rows 741 ms, 8 rows 590; held rising, s128's max gap went +1% -> +17%)."""
    sizes = knot_sizes(grid_sizes([_size(step, s) for s in samples], samples), tile if step == "prompt" else 0)
    hats = _hats(sizes)
    knot = knot_of(samples) if step == "generate" else np.inf
    n = len(sizes)
    steps = np.tril(np.ones((n, n))) if step == "prompt" else np.eye(n)  # knot k's value: the steps up to it
    H = np.array([[h(_size(step, s)) for h in hats] for s in samples]) @ steps
    rem = (lambda s: remainder_terms(_size(step, s), tile)) if step == "prompt" else (lambda s: [])
    counted = step == "generate" and counts_faults(samples)
    X = np.hstack([H, np.array([_terms(step, s, knot, counted) + rem(s) for s in samples])])
    y = np.array([s["seconds"] for s in samples])
    known = np.array([copies[0] * s.get("written", 0) + copies[1] * s.get("fresh", 0) for s in samples])
    x = nnls(X, y, y - known if step == "prompt" else y)
    dense = Curve(tuple(float(n) for n in sizes), tuple(float(v) for v in steps @ x[:len(sizes)]))
    rest = [float(v) for v in x[len(sizes):]]
    if step == "prompt":
        return MlxLmCosts((0.0, 0.0, rest[0], rest[1]), (0.0, 0.0, 0.0, 0.0), prompt_dense=dense,
                          prompt_tile=tile, prompt_rem=tuple(rest[2:5]) if tile else (0.0, 0.0, 0.0),
                          copy=copies[0], fresh=copies[1])
    att, rest = (rest[:2], rest[2:]) if knot < np.inf else ([rest[0], rest[0]], rest[1:])
    first, copy, fresh, page = (*rest, 0.0) if not counted else rest
    return MlxLmCosts((0.0, 0.0, 0.0, 0.0), (0.0, 0.0, att[0], att[1]), step_dense=dense, knot=knot, first=first,
                      copy=copy, fresh=fresh_by_faults(samples, page, fresh) if counted else fresh)


def pick_tile(samples: list[dict], copies: tuple[float, float]) -> int:
    """The prompt calls' tile whose form cross-validates best (0: none), when it beats no tile by
    a margin (`calibrate.fit.pdsim.pick_tile`'s rule)."""
    folds = size_folds([_size("prompt", s) for s in samples], random.Random("tile"))
    return best_tile(lambda t: _held_out("prompt", samples, folds, copies, t))


def price(m: MlxLmCosts, step: str, samples: list[dict]) -> np.ndarray:
    copies = np.array([m.copies("first" if s.get("first") else step, s.get("written", 0), s.get("fresh", 0))
                       for s in samples])
    if step == "prompt":
        return copies + np.array([m.prompt(s["rows"], s["chunk"], s["idx"]) for s in samples])
    return copies + np.array([m.step([s["context_max"]] * s["batch"]) + (m.first if s.get("first") else 0.0)
                              for s in samples])


def _held_out(step: str, pts: list[dict], tests: list[set[int]], copies, tile: int = 0) -> np.ndarray:
    errs = []
    for held in tests:
        train = [p for i, p in enumerate(pts) if i not in held]
        test = [p for i, p in enumerate(pts) if i in held]
        y = np.array([s["seconds"] for s in test])
        errs.append(np.abs(price(fit_step(step, train, copies, tile), step, test) - y) / y)
    return np.concatenate(errs)


def fit_mlx_lm(samples: list[dict], iteration: float, seed: int = 0) -> dict:
    """The profile's `cost.mlx_lm` and `fit` sections; marks held-out samples and fills in `fitted`.
    Calls of held-out BatchGenerator runs are only priced (`fit.replay`)."""
    held_runs = [s for s in samples if s.get("source", "").startswith(HELD_OUT)]
    fitted = [s for s in samples if not s.get("source", "").startswith(HELD_OUT)]
    forms, errors, copies = {}, {}, (0.0, 0.0)
    for step in ("generate", "prompt"):
        pts = [s for s in fitted if s["step"] == step]
        if len(pts) < 8:
            raise ValueError(f"mlx-lm calibration has only {len(pts)} {step} points; need at least 8")
        sizes = [_size(step, p) for p in pts]
        held = size_folds(sizes, random.Random(f"{seed}/{step}"))[0]
        for i, p in enumerate(pts):
            p["held_out"] = i in held
        tile = pick_tile(pts, copies) if step == "prompt" else 0
        e = _held_out(step, pts, [held], copies, tile)
        cv = _held_out(step, pts, size_folds(sizes, random.Random(f"cv{seed}")), copies, tile)
        errors[step] = {"held_out": len(held), "train": len(pts) - len(held), "form_mean": float(e.mean()),
                        "form_max": float(e.max()), "cv_folds": FOLDS, "cv_form_mean": float(cv.mean()),
                        "cv_form_max": float(cv.max()), "repeat_noise": repeat_noise(pts)}
        forms[step] = fit_step(step, pts, copies, tile)
        for p, f in zip(pts, price(forms[step], step, pts)):
            p["fitted"] = float(f)
        if step == "generate":
            copies = (forms[step].copy, forms[step].fresh)
    g, pr = forms["generate"], forms["prompt"]
    section = {
        "prompt": {"form": MLX_PROMPT_FORM, "coef": list(pr.prompt_coef), "dense": _pairs(pr.prompt_dense),
                   **({"tile": pr.prompt_tile, "remainder": list(pr.prompt_rem)} if pr.prompt_tile else {})},
        "generate": {"form": MLX_STEP_FORM, "coef": list(g.step_coef), "dense": _pairs(g.step_dense),
                     **({"knot": g.knot} if g.knot < np.inf else {}), "first": g.first},
        "copy": g.copy, "fresh": g.fresh, "iteration": iteration,
        **({"first_copy": g.first_copy} if g.first_copy is not None else {}),
    }
    fit = {"errors": errors, "target": TARGET, "speed_by_round": speed_by_round(samples)}
    fit |= noise_of(samples, fit["speed_by_round"])
    if held_runs:
        fit["replay"] = replay_errors(held_runs, section)
    return {"cost": {"mlx_lm": section}, "fit": fit}


def _pairs(c: Curve) -> list[list[float]]:
    return [[x, y] for x, y in zip(c.sizes, c.seconds)]


def cost_of(section: dict) -> LinearCostModel:
    from sim.cost.mlxlm import mlx_lm_costs
    return LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), mlx=mlx_lm_costs(section), pdsim_forms=False)


def replay_errors(calls: list[dict], section: dict) -> dict:
    """Calls of BatchGenerator runs the fit has not seen, priced: predicted/measured by kind and size."""
    m = cost_of(section).mlx
    ratios = [(s["call"], s["bucket"], float(price(m, s["step"], [s])[0] / s["seconds"])) for s in calls]
    copy = sum(m.copies("first" if s.get("first") else s["step"], s.get("written", 0), s.get("fresh", 0))
               for s in calls)
    return {"calls": len(calls), "by_kind": summarize(ratios, by_size=False), "by_size": summarize(ratios),
            "copy_share": copy / (sum(s["seconds"] for s in calls) or 1.0)}


def pipelined_replay(logs: list, section: dict) -> dict:
    """Held-out runs of BatchGenerator as the server runs it (nothing synchronized: each call's span
    is host time), every call priced as the simulator times it from its measured start
    (`sim.metrics.residuals.priced_calls`): predicted/measured by kind, at the calibration's speed."""
    ratios = call_ratios(logs, cost_of(section))
    return {"calls": len(ratios), "by_kind": summarize(ratios, by_size=False)}


def iteration_of(logs) -> float:
    """Host work between two next() calls (median over iterations), waits for arrivals excluded."""
    gaps = []
    for log in logs:
        calls, arrivals = log.calls, sorted(r.arrival for r in log.requests.values())
        for a, b in zip(calls, calls[1:]):
            if b.iteration != a.iteration and not any(a.end <= t <= b.start for t in arrivals):
                gaps.append(b.start - a.end)
    return float(statistics.median(gaps)) if gaps else 0.0
