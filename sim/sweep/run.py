"""Sweeps: replay traces under a grid of settings, one row of metrics per (setting, trace, rate scale).

Every point runs through `evaluate`, whether in this process, in local worker processes or on a
Dask cluster, so the three executors give the same numbers. Workers receive the traces and the
profile once (a pool initializer, or a Dask scatter), then only small tasks go out and flat metric
dicts come back: the event logs stay in the worker unless asked for.
"""
from __future__ import annotations

import gc
import itertools
import math
import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Mapping
from uuid import uuid4

import policies
from policies.settings import KEYS as SETTING_KEYS
from policies.settings import Setting, setting_label, unique
from sim.core.errors import UserError
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.scored_log import simulate_scored
from sim.metrics.scoring import Slo, score
from sim.metrics.tally import RequestTable
from sim.replay import simulate
from traces.trace import Request, Trace


class SweepError(UserError, ValueError):
    """A sweep that cannot run (empty grid, unreachable cluster); the message says which."""


@dataclass(frozen=True)
class Point:
    """One run of the grid: a policy setting on one trace at one arrival-rate scale."""
    setting: dict
    trace: str
    rate_scale: float = 1.0

    @property
    def label(self) -> str:
        return setting_label(self.setting)


@dataclass
class Inputs:
    """What every worker needs once: the traces by name, the profile, the scoring options."""
    traces: dict[str, Trace]
    profile: dict
    slo: Slo | None = None
    stall_ms: float = 100.0
    sha256: dict[str, str] = field(default_factory=dict)
    token: str = field(default_factory=lambda: uuid4().hex)  # names this sweep's inputs on Dask workers

    def __post_init__(self) -> None:
        for name, tr in self.traces.items():
            self.sha256.setdefault(name, tr.sha256())


def grid(settings: Iterable[Setting | Mapping], traces: Iterable[str] = ("tinyllm",),
         rate_scales: Iterable[float] = (1.0,)) -> list[Point]:
    """Every (trace, rate scale, setting) combination, in that nesting order.

    Settings may name only what differs from the defaults (`{"policy": "chunked", "budget": 64}`);
    each is completed by `policies.settings`, and settings that run the same work are swept once.
    Traces are names: of `Inputs.traces`, or, for `run_sweep` without inputs, generator names
    or trace files.
    """
    settings, traces, rate_scales = unique(settings), list(traces), list(rate_scales)
    for what, items in (("settings", settings), ("traces", traces), ("rate scales", rate_scales)):
        if not items:
            raise SweepError(f"empty grid: no {what} to sweep")
    for f in rate_scales:
        if not (math.isfinite(f) and f > 0):
            raise SweepError(f"rate scale must be a finite number > 0, got {f}")
    return [Point(dict(s), t, float(f)) for t, f, s in itertools.product(traces, rate_scales, settings)]


def scale_rate(trace: Trace, factor: float) -> Trace:
    """The same requests arriving `factor` times as fast (arrival times divided by `factor`)."""
    if factor == 1.0:
        return trace
    reqs = [Request(r.id, r.arrival / factor, r.prompt_len, r.output_len, r.prompt_ids, r.hash_ids, r.prefilled,
                    r.cls, r.ttft_slo_ms) for r in trace.requests]
    return Trace(reqs, dict(trace.meta, rate_scale=factor * trace.meta.get("rate_scale", 1.0)))


def evaluate(trace: Trace, setting: dict, cost, slo: Slo | None, stall_ms: float,
             keep_log: bool | str = False, about: dict | None = None) -> tuple[dict, dict | str | None]:
    """Simulate one setting and score it as it runs (`sim.metrics.scored_log`: memory that does not grow
    with the run's calls); (metrics, log). `keep_log`: a path writes the event log there as a
    columnar file (`sim.metrics.logfile`) as the run goes, and the path comes back; True keeps the log in
    memory and returns it as a dict (for a Dask worker, whose files the driver cannot see).
    `about`: what the log file's meta says of the run besides its setting and metrics.

    The cyclic garbage collector is paused during the replay: the engine's objects all stay alive,
    and scanning them over and over costs a fifth of the run.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if keep_log is True:
            log = simulate(trace, policies.make(**setting, cost=cost), cost)
            return score(log, slo, stall_ms), log.to_dict()
        writer = None
        if keep_log:
            from sim.metrics.logfile import LogWriter
            writer = LogWriter(keep_log, RequestTable.of(trace.requests), overwrite=True)
        try:
            tally = simulate_scored(trace, policies.make(**setting, cost=cost), cost, slo, stall_ms, keep_rows=bool(writer),
                                    writer=writer)
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        metrics = tally.result()
        if writer is not None:
            writer.close(dict(about or {}, setting=setting, metrics=metrics, estimated=tally.estimated()), tally.rows)
            return metrics, str(keep_log)
        return metrics, None
    finally:
        if was_enabled:
            gc.enable()


def row_of(point: Point, inputs: Inputs, metrics: dict) -> dict:
    """The DataFrame row: where the point is in the grid, then every metric."""
    row = {"trace": point.trace, "rate_scale": point.rate_scale, "label": point.label}
    row.update({k: point.setting.get(k) for k in SETTING_KEYS})
    row["queue"] = point.setting.get("queue", "fcfs")  # an fcfs setting's dict leaves it out (and its aging bound)
    row["trace_sha256"] = inputs.sha256[point.trace]
    row.update(metrics)
    return row


# --- the worker side: module state set once per process by the pool initializer -------------

_WORKER: dict = {}


def _init_worker(inputs: Inputs) -> None:
    if multiprocessing.parent_process() is not None:  # a pool worker: Ctrl-C is the driver's to handle
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.clear()
    _WORKER.update(inputs=inputs, cost=cost_model(inputs.profile), scaled={})
    gc.collect()
    gc.freeze()  # the traces never change: keep them out of every later collection


def _trace_for(inputs: Inputs, scaled: dict, point: Point) -> Trace:
    key = (point.trace, point.rate_scale)
    if key not in scaled:
        scaled[key] = scale_rate(inputs.traces[point.trace], point.rate_scale)
    return scaled[key]


def _run_local(point: Point, keep_log: bool | str) -> tuple[dict, dict | str | None]:
    w = _WORKER
    inp: Inputs = w["inputs"]
    return evaluate(_trace_for(inp, w["scaled"], point), point.setting, w["cost"], inp.slo, inp.stall_ms, keep_log,
                    about(point, inp))


def about(point: Point, inputs: Inputs) -> dict:
    """What a point's log file says it is a run of."""
    return {"label": point.label, "trace": {"name": point.trace, "sha256": inputs.sha256[point.trace]},
            "rate_scale": point.rate_scale}


_DASK_CACHE: dict = {}


def _run_dask(point: Point, keep_log: bool, inputs: Inputs) -> tuple[dict, dict | None]:
    """On a Dask worker: `inputs` is the scattered copy; its cost model and scaled traces are cached
    for the sweep that sent it (a new sweep replaces the cache)."""
    cache = _DASK_CACHE.get(inputs.token)
    if cache is None:
        _DASK_CACHE.clear()
        cache = _DASK_CACHE[inputs.token] = {"cost": cost_model(inputs.profile), "scaled": {}}
    return evaluate(_trace_for(inputs, cache["scaled"], point), point.setting, cache["cost"], inputs.slo,
                    inputs.stall_ms, keep_log)


# --- the driver side ---------------------------------------------------------------------------

def work_estimate(point: Point, trace: Trace) -> float:
    """A rough count of engine calls, used only to start the longest runs first (better packing)."""
    out = sum(r.output_len for r in trace.requests)
    prompt = sum(r.prompt_len for r in trace.requests)
    s = point.setting
    if s["policy"] == "mlx-lm":
        return out / s["decode_concurrency"] + prompt / (s["prefill_step"] * s["prompt_concurrency"])
    if s["policy"] == "vllm":
        return out / s["max_num_seqs"] + prompt / s["max_num_batched_tokens"]
    one_at_a_time = s["policy"] == "fifo" or s.get("decode") == "single"
    budget = s["budget"] if isinstance(s["budget"], int) else 64 if s["budget"] else 1e9  # auto:MS: a guess
    return out / (1 if one_at_a_time else s["batch_size"]) + prompt / budget


def run_points(points: list[Point], inputs: Inputs, workers: int | None = None, scheduler: str | None = None,
               keep_logs: bool | list[str] = False, progress: bool = True,
               connect_timeout: float = 10.0) -> list[tuple[dict, dict | str | None]]:
    """(metrics, log or None) for each point, in the order given.

    `scheduler`: a Dask scheduler address (tcp://host:port) or a `distributed.Client`; otherwise
    `workers` local processes (default: one per core; 1 runs in this process). `keep_logs`: True
    returns each log as a dict; a list of paths, one per point, has each local worker write its
    point's log file there as it runs (`evaluate`), and on Dask returns dicts instead.
    """
    paths = keep_logs if isinstance(keep_logs, list) else [keep_logs] * len(points)
    if not points:
        raise SweepError("empty grid: no settings to sweep")
    for p in points:
        if p.trace not in inputs.traces:
            raise SweepError(f"point {p.label} names trace {p.trace!r}, which the sweep was not given")
    if scheduler is not None:
        return _run_on_dask(points, inputs, scheduler, bool(keep_logs), progress, connect_timeout)
    workers = min(workers or os.cpu_count() or 1, len(points))
    if workers == 1:
        _init_worker(inputs)
        try:
            return [_run_local(p, k) for p, k in _bar(list(zip(points, paths)), len(points), progress)]
        finally:
            _WORKER.clear()
            gc.unfreeze()
    # the longest runs first (better packing); map yields in that order, about as they finish
    order = sorted(range(len(points)), key=lambda i: -work_estimate(points[i], inputs.traces[points[i].trace]))
    results: list = [None] * len(points)
    pool = ProcessPoolExecutor(workers, mp_context=_context(), initializer=_init_worker, initargs=(inputs,))
    try:
        done = pool.map(_run_local, [points[i] for i in order], [paths[i] for i in order])
        for i, result in zip(order, _bar(done, len(points), progress)):
            results[i] = result
    except BaseException:  # Ctrl-C or a failed run: do not wait for the queued runs
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    return results


def _context():
    """fork on Linux: scripts and notebooks need no `if __name__ == "__main__"` guard, and workers
    start in milliseconds. Elsewhere (macOS) the platform's safe default, spawn."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if sys.platform == "linux" and "fork" in methods else None)


def _run_on_dask(points, inputs, scheduler, keep_logs, progress, timeout):
    from dask.distributed import Client
    from dask.distributed import as_completed as dask_completed
    own = isinstance(scheduler, str)
    if own:
        try:
            client = Client(scheduler, timeout=timeout, set_as_default=False)
        except Exception as e:  # OSError, TimeoutError, ValueError for a malformed address
            reason = " ".join(str(e).split()) or type(e).__name__
            raise SweepError(f"Dask scheduler {scheduler!r} does not answer ({reason[:160]})") from None
    else:
        client = scheduler
    try:
        [shared] = client.scatter([inputs], broadcast=True, hash=False)
        futures = [client.submit(_run_dask, p, keep_logs, shared, pure=False) for p in points]
        index = {f.key: i for i, f in enumerate(futures)}
        results: list = [None] * len(points)
        for fut in _bar(dask_completed(futures, loop=client.loop), len(points), progress):
            results[index[fut.key]] = fut.result()
        return results
    finally:
        if own:
            client.close()


def _bar(items, total: int, progress: bool):
    if not progress:
        return items
    from tqdm.auto import tqdm
    return tqdm(items, total=total, desc="sweep", unit="run", smoothing=0)


def default_inputs(points: list[Point], profile: dict | str | None = None, slo: Slo | None = None,
                   stall_ms: float = 100.0) -> Inputs:
    """Inputs for points that name generators or trace files (`traces.load.resolve`, default
    options), with `profile` (a dict, a path, or None: the built-in illustrative profile)."""
    from traces.load import resolve
    names = list(dict.fromkeys(p.trace for p in points))
    prof = profile if isinstance(profile, dict) else load_profile(profile or BUILTIN)
    return Inputs({name: resolve(name) for name in names}, prof, slo, stall_ms)


def run_sweep(points: list[Point], inputs: Inputs | None = None, workers: int | None = None, scheduler=None,
              progress: bool = True, connect_timeout: float = 10.0, *, profile: dict | str | None = None,
              slo: Slo | None = None, stall_ms: float = 100.0):
    """Run the grid; a pandas DataFrame with one row per point, in grid order.

    Without `inputs`, the points' traces are resolved by name and `profile` is used
    (`default_inputs`): `run_sweep(grid([{"policy": "chunked", "budget": b} for b in (32, 128)]))`.
    """
    import pandas as pd
    inputs = inputs or default_inputs(points, profile, slo, stall_ms)
    results = run_points(points, inputs, workers, scheduler, False, progress, connect_timeout)
    return pd.DataFrame([row_of(p, inputs, m) for p, (m, _) in zip(points, results)])
