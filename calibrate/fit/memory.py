"""Fit the peak-memory model (`sim.engine.memory`) to the peaks a calibration measured, and say how well
it predicts peaks it has not seen.

The grid's prefill and decode points carry `peak_extra`: how far MLX's memory in use rose above
what was in use before the timed call (`calibrate.measure.profiler._measured`). Of that, what the call
added to its cache's buffer is known (`grown` token-rows at `kv_bytes_per_token` each: the
growth, not the rows copied); the rest is the call's activations, fitted by a non-negative least squares in bytes on the forms of
`sim.engine.memory` (bytes, not relative error: the largest calls set a run's peak). Errors, as for the
cost terms: on a seeded quarter of the points held out of one fit and by 4-fold
cross-validation, each relative to the measured rise; and, the figure a user reads, the whole
peak of every engine run the calibration served (held-out ones never fitted), predicted for its
calls by the model against `mx.get_peak_memory` over the run.
"""
from __future__ import annotations

import random
import statistics

import numpy as np
from scipy.optimize import lsq_linear

from sim.engine.batchcache import STEP, write
from sim.engine.log import EventLog
from sim.engine.memory import (
    MemoryModel,
    decode_features,
    kv_bytes_per_token,
    prefill_features,
    state_bytes_per_request,
)
from sim.engine.relog import relog
from traces.trace import Trace

FOLDS = 4
NO_COUNTER = "MLX reported no peak memory on this device (mx.get_peak_memory read 0): no memory model"


def model_config(prof_model: dict) -> dict:
    """The profile's `model` section as `kv_bytes_per_token` reads it: the shapes and the dtype."""
    return dict(prof_model.get("shapes") or {}, dtype=prof_model.get("dtype") or "float32")


def _features(step: str, s: dict) -> tuple[float, ...]:
    if step == "prefill":
        return prefill_features(s["chunk"], s["prefix"])
    return decode_features(s["batch"], int(round(s["context_max"])))


def _points(samples: list[dict], step: str) -> list[dict]:
    """The grid's points of `step` with a measured peak (engine-run calls carry none)."""
    return [s for s in samples if s["step"] == step and "source" not in s and "peak_extra" in s]


def grown(s: dict) -> int:
    """Token-rows a grid point's call added to its cache's buffer: a prefill at offset P starts from
    a buffer of the profiler's sliced capacity (`calibrate.measure.profiler.sliced`; none at offset 0); a
    decode's buffers have room. Memory in use rises by the growth, not by the rows copied."""
    if s["step"] != "prefill" or not s.get("written"):
        return 0
    cap = (s["prefix"] // STEP + 1) * STEP if s["prefix"] else 0
    return write(cap, s["prefix"], s["chunk"])[0] - cap


def _fit(step: str, pts: list[dict], kv: float) -> np.ndarray:
    X = np.array([_features(step, s) for s in pts], float)
    y = np.array([s["peak_extra"] - kv * grown(s) for s in pts], float)
    scale = np.maximum(np.abs(X).max(axis=0), 1.0)  # columns of bytes per token and per score differ by 1e6
    return lsq_linear(X / scale, y, bounds=(0.0, np.inf)).x / scale


def _rel(step: str, coef: np.ndarray, pts: list[dict], kv: float) -> np.ndarray:
    """|predicted - measured| / measured rise, per point."""
    pred = np.array([float(np.dot(coef, _features(step, s))) + kv * grown(s) for s in pts])
    meas = np.array([max(s["peak_extra"], 1) for s in pts], float)
    return np.abs(pred - meas) / meas


def _folds(n: int, rng: random.Random) -> list[set[int]]:
    order = list(range(n))
    rng.shuffle(order)
    return [set(order[k::FOLDS]) for k in range(FOLDS)]


def _held_out(step: str, pts: list[dict], tests: list[set[int]], kv: float) -> np.ndarray:
    errs = []
    for held in tests:
        train = [p for i, p in enumerate(pts) if i not in held]
        test = [p for i, p in enumerate(pts) if i in held]
        if train and test:
            errs.append(_rel(step, _fit(step, train, kv), test, kv))
    return np.concatenate(errs) if errs else np.zeros(0)


def run_peaks(model: MemoryModel, runs: list[dict]) -> list[dict]:
    """Each engine run that measured its peak: predicted (the model over the run's calls, through
    the state machine) against measured, in bytes."""
    out = []
    for r in runs:
        measured = r.get("log", {}).get("peak_memory")
        if not measured:
            continue
        trace = Trace.from_dicts(r["trace"]["requests"], r["trace"]["meta"])
        predicted = relog(trace, EventLog.from_dict(r["log"]), memory=model).peak_memory
        out.append({"name": r["name"], "part": r["part"], "predicted_bytes": predicted, "measured_bytes": measured,
                    "rel_error": (predicted - measured) / measured})
    return out


def fit_memory(samples: list[dict], config: dict, weights: float, runs: list[dict] = (), seed: int = 0) -> dict:
    """The profile's `memory` section: the model (`sim.engine.memory.MemoryModel.to_dict`) and `errors`."""
    kv = kv_bytes_per_token(config)
    by_step = {step: _points(samples, step) for step in ("prefill", "decode")}
    base = {"weights_bytes": weights, "kv_bytes_per_token": kv, "source": "mx.get_peak_memory"}
    if any(len(p) < 4 for p in by_step.values()) or not any(s["peak_extra"] for p in by_step.values() for s in p):
        return dict(base, prefill=None, decode=None, note=NO_COUNTER)
    coefs, errors = {}, {}
    for step, pts in by_step.items():
        held = _folds(len(pts), random.Random(f"{seed}/memory/{step}"))[0]
        e = _held_out(step, pts, [held], kv)
        cv = _held_out(step, pts, _folds(len(pts), random.Random(f"cv{seed}/memory")), kv)
        coefs[step] = [float(x) for x in _fit(step, pts, kv)]
        errors[step] = {"points": len(pts), "held_out": len(held), "form_mean": float(e.mean()),
                        "form_max": float(e.max()), "cv_folds": FOLDS, "cv_form_mean": float(cv.mean()),
                        "cv_form_median": float(np.median(cv)), "cv_form_max": float(cv.max())}
    model = MemoryModel(float(weights), float(kv), tuple(coefs["prefill"]), tuple(coefs["decode"]),
                        float(state_bytes_per_request(config)))
    peaks = run_peaks(model, list(runs))
    if peaks:
        errors["runs"] = peaks
        errors["runs_median_abs"] = statistics.median(abs(p["rel_error"]) for p in peaks)
    return dict(base, **model.to_dict(), errors=errors)
