"""Fit the cost model to measured step times, and say how well it predicts points it has not seen.

The forms (sim/cost/model.py) are linear in their coefficients: dense(n) is a curve through one
value per measured size (a hat-function basis), plus the attention terms. The fit is a
non-negative least squares on relative error (relative to the prediction, see `nnls`), so a 5 ms
decode counts as much as a 5 s prefill. The batch cache's rebuilds (sync calls, timed apart in
the engine runs) are fitted first and price the KV token-rows every other call writes.
Errors are reported two ways: on a seeded quarter of the points per step held out from one fit,
and by 4-fold cross-validation (every point held out once; a steadier figure than a handful of
points); both hold points out stratified by measured size. Each step uses interpolation over the
grid instead of the form where that predicts the engine runs' calls better (`choose_use`).
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field, replace

import numpy as np

from calibrate.fit.common import (FOLDS, HELD_OUT, TARGET, best_tile, choose_use, context_max, grid_sizes, is_single, knot_of,
                                   knot_sizes, nnls, noise_of, remainder_terms, repeat_noise, size_folds, speed_by_round)
from calibrate.fit.copies import (Copies, copy_terms, fit_copies, fit_copy, is_single_growth,
                                   is_step_growth_sample, kv_seconds)
from calibrate.fit.mixed import fit_mixed
from sim.core.errors import InputError
from sim.cost.curve import Curve
from sim.cost.grid import GridCostModel
from sim.cost.model import DECODE_FORM, PREFILL_FORM, LinearCostModel
from sim.metrics.residuals import summarize


def _size(step: str, s: dict) -> int:
    """What the dense layers' cost depends on: rows through the weights (a sync: the batch's rows)."""
    return s["chunk"] if step == "prefill" else s["batch"]


def _attention(step: str, s: dict, knot: float, lone: bool) -> list[float]:
    """The physical terms besides dense(n): prefill c*L*(P + L/2) and d*P; decode
    batch*(c*min(x, knot) + e*max(0, x - knot)) for the longest context x, and with `lone`, a
    single decode its own slope (one column, zero for batches)."""
    if step == "prefill":
        return [s["chunk"] * (s["prefix"] + s["chunk"] / 2), s["prefix"]]
    x, b = context_max(s), s["batch"]
    if lone and is_single(s):
        return [0.0] * (2 if knot < np.inf else 1) + [x]
    rows = [b * min(x, knot), b * max(0.0, x - knot)] if knot < np.inf else [b * x]
    return rows + [0.0] if lone else rows


@dataclass
class Form:
    """A fitted form: coef [a, b, c, d] for prefill and [a, b, c(, e)] for decode, a = b = 0 since
    the measured dense curve replaces a + b*n; the decode knot (inf: one slope), single slope,
    the prefill tile and remainder, and the KV copies' prices (`Copies`)."""
    step: str
    coef: list[float]
    dense: list[list[float]]
    knot: float = np.inf
    lone: float | None = None  # single decode: seconds per context token (None: as a batch row)
    tile: int = 0
    rem: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    copies: Copies = Copies()

    def model(self) -> LinearCostModel:
        curve, k = Curve.from_pairs(self.dense), self.copies
        if self.step == "prefill":
            return LinearCostModel(tuple(self.coef), (0.0, 0.0, 0.0), prefill_dense=curve, prefill_tile=self.tile,
                                   prefill_rem=tuple(self.rem), copy=k.copy, fresh=k.fresh, gather=k.gather,
                                   fresh_step=k.fresh_step, grow=k.grow, grow_single=k.grow_single)
        return LinearCostModel((0.0, 0.0, 0.0, 0.0), tuple(self.coef), decode_dense=curve, decode_knot=self.knot,
                               decode_lone=self.lone, copy=k.copy, fresh=k.fresh, gather=k.gather,
                               fresh_step=k.fresh_step, grow=k.grow, grow_single=k.grow_single,
                               join=(k.join, 0.0, 0.0),
                               leave=(k.leave, 0.0, 0.0))


def fit_fresh_step(samples: list[dict], forms: dict[str, Form],
                   page: float | None = None) -> tuple[float | None, float | None]:
    """Per fresh token-row of a prefill's or decode's own growth (None without any such steps),
    with the part of it that is page faults (None where not priced by faults). With `page` (a
    fault the host backs, `speed_probe.dear_page_seconds`) and steps that counted their faults:
    the median faults per fresh row over the faulted steps, at `page` each, as a single decode's
    growth (`fit_grow_single`); the row's copy is `grow`. Else the median over such steps of their
    time beyond their price without fresh memory, per fresh row.

    Why by faults: a calibration serves two or three such steps, and they meet cheap or dear
    faults by chance. By their time, the two calibrations of one round priced a fresh row of a
    growth at 90 and 192 us, where their confirm runs' growths (120 fresh rows, 74-87 faulted) paid
    13-16 us a faulted page, and fifo's max ITL, which such a growth sets, came out 11-15% low.
    Their faults per fresh row are steadier: 15-52 pages over the calibrations' decode growths,
    34-41 in the confirm runs. A prefill's growth has no say where a decode's counted faults: its faults
    count its activations too (95 pages a fresh row). A join's fresh rows cost 4-5x a growth's by
    the time-beyond median, so one price for both over-prices every growth."""
    decodes = [s for s in samples if s["step"] == "decode" and s.get("faults") and s.get("fresh")]  # not a prefill's
    faults = _faults_per(decodes or samples, "fresh", page)
    if faults is not None:
        return faults, faults
    return _median_beyond(samples, forms, "fresh", ("fresh",)), None


def fit_grow(samples: list[dict], forms: dict[str, Form]) -> float | None:
    """Per token-row a decode's own buffer growth writes, in memory used before: the median over
    such decodes of their time beyond their price without copies, per row (None without any).
    The step pays it inside its graph, layer by layer, and it cost about twice a sync's row here:
    a median 91-118 us over three rounds' calibrations and confirm runs, where the syncs priced
    44-57."""
    return _median_beyond(samples, forms, "written", ("written", "fresh"))


def fit_grow_single(samples: list[dict], forms: dict[str, Form],
                    page: float | None = None) -> tuple[float | None, float | None]:
    """Per token-row a single decode's own growth writes (a request's own cache, fresh memory or
    not). With `page`, the price of a page fault the host backs (`speed_probe.dear_page_seconds`),
    and samples that counted their faults: a row's copy (`grow`) plus the median faults per row
    written over the faulted samples, at `page` each. Such a growth costs what its faults cost, 2.5-4 us
    or 10-22 us each (by whether the guest or the host backed them), and the two or three
    growths a calibration serves meet either by chance: 62 us a row in one of two calibrations
    and 272 in the other, where their confirm runs' worst growths paid 275-555. Without them: the
    median over such decodes of their time beyond their price without copies, per row (None
    without any samples). Returned with the part of it that is page faults (None where it is not
    priced by faults): a confirm prices that part at the fault price its probes read
    (`sim.cost.speed.MachineSpeed.page`)."""
    faults = _faults_per(samples, "written", page)
    if faults is not None:
        k = forms["decode"].copies
        return (k.copy if k.grow is None else k.grow) + faults, faults
    return _median_beyond(samples, forms, "written", ("written", "fresh")), None


def _faults_per(samples: list[dict], per: str, page: float | None) -> float | None:
    """The median page faults per unit of `per` over the samples that counted some, at `page`
    seconds each (None without `page` or such samples): a growth's faults at the dear price."""
    faulted = [s for s in samples if s.get("faults") and s.get(per)]
    if page is None or not faulted:
        return None
    return statistics.median(s["faults"] / s[per] for s in faulted) * page


def _median_beyond(samples: list[dict], forms: dict[str, Form], per: str, unpriced: tuple[str, ...]) -> float | None:
    """The median over samples of their time beyond their price with the `unpriced` fields at 0,
    per unit of `per` (>= 0; None without samples): a price that scatters 2-5x from call to call,
    so the typical call's, not a fit's."""
    if not samples:
        return None
    models = {step: form.model() for step, form in forms.items()}
    beyond = [(s["seconds"] - _predict(models[s["step"]], s["step"], [dict(s, **dict.fromkeys(unpriced, 0))])[0])
              / s[per] for s in samples]
    return max(0.0, float(statistics.median(beyond)))


def _priced(forms: dict[str, Form], **prices) -> dict[str, Form]:
    """The forms with these copy prices set in the decode's and prefill's `Copies`."""
    return {step: replace(f, copies=replace(f.copies, **prices)) if step in ("decode", "prefill") else f
            for step, f in forms.items()}


def fit_form(step: str, samples: list[dict], tile: int | None = None, copies: Copies | None = None) -> Form:
    """Non-negative least squares on relative error, over a hat basis for dense(n), the attention
    terms and (prefill) a tile's remainder. The KV copies' prices are known (`copies`, fitted on
    the sync calls; a prefill's chunks write buffers only at 256-token steps, too rarely to tell
    the terms apart) or, for decode samples from before syncs were timed apart, fitted with the
    form (`copies` None)."""
    if step == "sync":
        return Form("sync", [0.0, 0.0, 0.0], [], copies=fit_copies(samples))
    # knots at the grid's sizes (medians over rounds), not at an engine run's one-off call: a knot there
    # would fit that one noisy timing and bend the curve's ends (an eager prompt of 208 tokens set the
    # slope past 256 twice the one below; prompts of 271-331 were priced 1.15x)
    sizes = grid_sizes([_size(step, s) for s in samples], samples)
    if step == "prefill" and tile is None:
        tile = pick_tile(samples, copies or Copies())
    tile = tile or 0
    knots = knot_sizes(sizes, tile)
    knot = knot_of(samples) if step == "decode" else np.inf
    lone = step == "decode" and any(is_single(s) for s in samples) and len(sizes) > 1
    hats = [Curve(tuple(knots), tuple(float(i == k) for i in range(len(knots)))) for k in range(len(knots))]
    if step == "prefill":
        extra = lambda s: remainder_terms(s["chunk"], tile)
    else:
        extra = (lambda s: []) if copies is not None else copy_terms
    X = np.array([[h(_size(step, s)) for h in hats] + _attention(step, s, knot, lone) + extra(s) for s in samples])
    y = np.array([s["seconds"] for s in samples])
    known = copies or Copies()
    x = nnls(X, y, y - np.array([known.of(s) for s in samples]))
    dense = [[float(n), float(v)] for n, v in zip(knots, x)]
    n_att = len(_attention(step, samples[0], knot, lone))
    att = [float(c) for c in x[len(knots):len(knots) + n_att]]
    more = [float(c) for c in x[len(knots) + n_att:]]
    if step == "prefill":
        return Form(step, [0.0, 0.0] + att, dense, tile=tile, rem=more or [0.0, 0.0, 0.0], copies=known)
    return Form(step, [0.0, 0.0] + att[:len(att) - lone], dense, knot, att[-1] if lone else None,
                copies=copies if copies is not None else Copies(*more))


def pick_tile(samples: list[dict], copies: Copies = Copies()) -> int:
    """The prefill tile whose form cross-validates best (0: a plain curve through every size),
    when it beats the plain curve by a margin: with a few unaligned lengths two tiles can tie."""
    folds = size_folds([s["chunk"] for s in samples], random.Random("tile"))
    return best_tile(lambda t: _held_out_errors("prefill", samples, folds, tile=t, copies=copies)[0])


def _grid_points(step: str, samples: list[dict]) -> np.ndarray:
    """(size, prefix or longest context, seconds) of the grid's points (medians over rounds), not
    the engine runs' single timings; decodes without singles."""
    grid = [s for s in samples if "source" not in s]
    if step == "prefill":
        return np.array([[s["chunk"], s["prefix"], s["seconds"]] for s in grid], float)
    plain = [s for s in grid if not is_single(s)]
    return np.array([[s["batch"], context_max(s), s["seconds"]] for s in plain], float)


def _rel_errors(pred: np.ndarray, samples: list[dict]) -> np.ndarray:
    y = np.array([s["seconds"] for s in samples])
    return np.abs(pred - y) / y


def _predict(model, step: str, samples: list[dict]) -> np.ndarray:
    """Each sample priced from its shape, its KV copies and batch changes included."""
    copy = np.array([kv_seconds(model, s) for s in samples])
    if step == "prefill":
        return copy + np.array([model.prefill(s["chunk"], s["prefix"]) for s in samples])
    member = np.array([model.membership(s.get("joined", 0), s.get("left", 0), _contexts(s)) for s in samples])
    if step == "sync":
        return copy + member
    return copy + member + np.array([model.decode(_contexts(s), is_single(s)) for s in samples])


def _contexts(s: dict) -> list[float]:
    """A batch with the sample's size and longest context: what the decode form depends on (a
    single decode of several requests: each its own context)."""
    if is_single(s) and "contexts" in s:
        return list(s["contexts"])
    return [context_max(s)] * s["batch"]


def fit_profile(samples: list[dict], seed: int = 0, page: float | None = None) -> dict:
    """The profile's `cost` and `fit` sections; marks held-out samples and fills in `fitted`.
    Calls of held-out engine runs are not fitted: `fit.replay` prices them, by call kind.
    `page`: seconds a page fault the host backs costs (`fit_grow_single`; None: not probed).

    Syncs first (the batch cache's rebuilds, timed on their own in the engine runs): they price a
    KV token-row written and fresh, which the decode and prefill fits then take as known.
    Profiles from before syncs were timed apart fit those prices with the decode form."""
    held_runs = [s for s in samples if s.get("source", "").startswith(HELD_OUT)]
    samples = [s for s in samples if not s.get("source", "").startswith(HELD_OUT)]
    mixed = [s for s in samples if s["step"] == "mixed"], [s for s in held_runs if s["step"] == "mixed"]
    held_runs = [s for s in held_runs if s["step"] != "mixed"]
    by_step = {st: [s for s in samples if s["step"] == st] for st in ("sync", "decode", "prefill")}
    if not by_step["sync"]:
        del by_step["sync"]
    # steps whose own growth met fresh memory, decodes whose own growth met none, and single
    # decodes whose own cache grew price their rows apart (`fit_fresh_step`, `fit_grow`,
    # `fit_grow_single`), not in their form
    alone = [s for s in samples if "sync" in by_step and is_single_growth(s)]
    growth = [s for s in samples if "sync" in by_step and s.get("fresh") and is_step_growth_sample(s) and not is_single_growth(s)]
    warm = [s for s in samples if "sync" in by_step and s["step"] == "decode" and s.get("written")
            and not s.get("fresh") and is_step_growth_sample(s) and not is_single_growth(s)]
    grown = {id(s) for s in growth + warm + alone}
    for st in ("decode", "prefill"):
        by_step[st] = [s for s in by_step[st] if id(s) not in grown]
    forms, errors, uses, copies = {}, {}, {}, None
    for step, pts in by_step.items():
        if len(pts) < 4:
            raise InputError(f"calibration has only {len(pts)} {step} points; need at least 4")
        tile = pick_tile(pts, copies or Copies()) if step == "prefill" else None
        sizes = [_size(step, p) for p in pts]
        held = size_folds(sizes, random.Random(f"{seed}/{step}"))[0]  # a quarter, every size represented
        for i, p in enumerate(pts):
            p["held_out"] = i in held
        e_form, e_grid = _held_out_errors(step, pts, [held], tile, copies)
        folds = size_folds(sizes, random.Random(f"cv{seed}"))
        cv_form, cv_grid = _held_out_errors(step, pts, folds, tile, copies)
        errors[step] = {"held_out": len(held), "train": len(pts) - len(held),
                        "form_mean": float(e_form.mean()), "form_max": float(e_form.max()),
                        "cv_folds": FOLDS, "cv_form_mean": float(cv_form.mean()), "cv_form_max": float(cv_form.max()),
                        "repeat_noise": repeat_noise(pts)}
        if step != "sync":
            order = [pts[i] for f in folds for i in sorted(f)]  # the samples in cv_form's order
            uses[step] = choose_use(order, cv_form, cv_grid)
            errors[step].update({"grid_mean": float(e_grid.mean()), "grid_max": float(e_grid.max()),
                                 "cv_grid_mean": float(cv_grid.mean()), "cv_grid_max": float(cv_grid.max()),
                                 "use": uses[step], **({"tile": tile} if step == "prefill" else {})})
        forms[step] = fit_form(step, pts, tile, copies)  # the final fit uses every point
        copies = forms[step].copies
    grow = fit_grow(warm, forms)
    forms = _priced(forms, grow=grow)
    fresh_step, fresh_step_faults = fit_fresh_step(growth, forms, page)  # beyond the rows' price at `grow`
    forms = _priced(forms, fresh_step=fresh_step)
    grow_single, grow_single_faults = fit_grow_single(alone, forms, page)
    forms = _priced(forms, grow_single=grow_single)
    for s in growth + warm + alone:
        s["held_out"] = False  # fitted on their own, never held out
    med = lambda st: statistics.median([s["seconds"] for s in samples if s["step"] == st] or [0.0])
    pf, dc = forms["prefill"], forms["decode"]
    cost = {
        "use": "grid" if "grid" in uses.values() else "fit",  # read by older pdsim; the steps' `use` decide
        "prefill": {"form": PREFILL_FORM, "coef": pf.coef, "dense": pf.dense, "use": uses["prefill"],
                    **({"tile": pf.tile, "remainder": pf.rem} if pf.tile else {}),
                    "grid": _grid_points("prefill", by_step["prefill"]).tolist()},
        "decode": {"form": DECODE_FORM, "coef": dc.coef, "dense": dc.dense, "use": uses["decode"],
                   **({"knot": dc.knot} if dc.knot < np.inf else {}),
                   **({"lone": dc.lone} if dc.lone is not None else {}),
                   "grid": _grid_points("decode", by_step["decode"]).tolist()},
        "iteration": med("overhead"),
        "copy": copies.copy,
        "fresh": copies.fresh,
        **({"gather": copies.gather} if copies.gather is not None else {}),
        **({"fresh_step": fresh_step} if fresh_step is not None else {}),
        **({"fresh_step_faults": fresh_step_faults} if fresh_step_faults is not None else {}),
        **({"grow": grow} if grow is not None else {}),
        **({"grow_single": grow_single} if grow_single is not None else {}),
        **({"grow_single_faults": grow_single_faults} if grow_single_faults is not None else {}),
        # syncs in which requests join or leave the batch cache, besides their copies (profiles before
        # `copy` timed these as steps of their own: a + b*batch + c*batch*max(context))
        "join": fit_copy([s for s in samples if s["step"] == "join"]) or [copies.join, 0.0, 0.0],
        "leave": fit_copy([s for s in samples if s["step"] == "leave"]) or [copies.leave, 0.0, 0.0],
    }
    for step, pts in by_step.items():
        pts = pts + [s for s in growth + warm + alone if s["step"] == step]
        for p, f in zip(pts, _predict(forms[step].model(), step, pts)):
            p["fitted"] = float(f)
    fit = {"errors": errors, "target": TARGET, "uses": cost["use"], "speed_by_round": speed_by_round(samples),
           **({"page_fault_s": page} if page is not None else {})}
    fit |= noise_of(samples, fit["speed_by_round"])
    if held_runs:
        fit["replay"] = replay_errors(held_runs, forms)
    if fused := fit_mixed(*mixed, copies, seed, (pf.tile, tuple(pf.rem))):  # vLLM's forwards (`calibrate.fit.mixed`)
        cost["mixed"], errors["mixed"] = fused["cost"], fused["errors"]
        fit.setdefault("replay", {})["mixed"] = fused.get("replay")
    return {"cost": cost, "fit": fit}


def replay_errors(calls: list[dict], forms: dict[str, Form]) -> dict:
    """Calls of engine runs the fit has not seen, priced: predicted/measured by kind and size."""
    models = {step: form.model() for step, form in forms.items()}
    models.setdefault("sync", models["decode"])  # a profile without sync samples prices them as its decodes' copies
    ratios = [(s["call"], s["bucket"], float(_predict(models[s["step"]], s["step"], [s])[0] / s["seconds"]))
              for s in calls]
    k = forms["decode"].copies
    copy = sum(kv_seconds(k, s) for s in calls)
    return {"calls": len(calls), "by_kind": summarize(ratios, by_size=False), "by_size": summarize(ratios),
            "copy_share": copy / (sum(s["seconds"] for s in calls) or 1.0), "speeds": replay_speeds(calls)}


def replay_speeds(calls: list[dict]) -> dict[str, dict[str, float]]:
    """Per engine run, the machine speed its calls' times were brought back from
    (`calibrate.measure.engine_runs.run_speeds`; 1.0: timed at the calibration's speed)."""
    out: dict[str, dict[str, float]] = {}
    for s in calls:
        out.setdefault(s["source"].split(":", 1)[-1], {})["prefill" if s["step"] == "prefill" else "decode"] = \
            float(s.get("speed", 1.0))
    return out


def _held_out_errors(step: str, pts: list[dict], tests: list[set[int]], tile: int | None = None,
                     copies: Copies | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Relative errors (form, grid interpolation) on each test set, each predicted by a fit of
    the other points only (syncs have no grid: the form's errors twice)."""
    e_form, e_grid = [], []
    for held in tests:
        train = [p for i, p in enumerate(pts) if i not in held]
        test = [p for i, p in enumerate(pts) if i in held]
        lin = fit_form(step, train, tile, copies).model()
        e_form.append(_rel_errors(_predict(lin, step, test), test))
        e_grid.append(e_form[-1] if step == "sync" else _rel_errors(_predict(_grid_model(step, lin, train), step, test), test))
    return np.concatenate(e_form), np.concatenate(e_grid)


def _grid_model(step: str, lin: LinearCostModel, train: list[dict]) -> GridCostModel:
    pts = _grid_points(step, train)
    dummy = np.array([[1, 0, 0], [2, 0, 0], [1, 1, 0]], float)
    return GridCostModel(lin, pts if step == "prefill" else dummy, pts if step == "decode" else dummy)
