"""`pdsim calibrate --engine mlx-lm`: time mlx-lm BatchGenerator's calls, fit, write a profile.

As pdsim's own calibration (`calibrate.calibration`): a grid of calls timed on their own path in
shuffled rounds (`calibrate.measure.mlxlm_profiler`), and short engine runs between the rounds, each in
a fresh process after a warm-up, through the installed BatchGenerator itself (`calibrate.engine.batchgen`):
two fitted (spread arrivals with prompts longer than the step; all at t=0 with staggered
outputs, so rows join and leave the generation batch at many sizes) and two held out, never
fitted, whose calls the fitted model prices by kind. The profile prices mlx-lm's calls only
(`engine: mlx-lm`); pdsim's own engine needs its own calibration.
"""
from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from calibrate.engine.mlxlm_batches import installed_version
from calibrate.engine.model import build_model
from calibrate.fit.mlxlm import fit_mlx_lm, iteration_of, pipelined_replay
from calibrate.host.machine import host_info
from calibrate.measure.engine_runs import EngineRuns, Workload, between_calls_share, engine_samples, relogged
from calibrate.measure.grid import MlxLmGrid
from calibrate.measure.journal import Journal
from calibrate.measure.mlxlm_profiler import MlxLmProfiler
from calibrate.measure.profiler import run_grid
from calibrate.profiles import refuse_existing, write_profile
from policies.mlxlm import check_version
from sim.core.errors import UserError
from sim.engine.heap import GROUPS
from sim.engine.memory import attention_layers, profile_state_tokens, state_tokens
from traces.generators import fixed, poisson
from traces.trace import Trace


def workloads(max_prompt: int, vocab: int, outputs: int = 12) -> dict[str, list[Workload]]:
    """BatchGenerator runs: `train` fitted, `held_out` only priced (other seeds and settings; one
    run as the server runs it, pipelined, priced as the simulator times such runs)."""
    def staggered(n, seed):
        rng = random.Random(seed)
        return fixed([0.0] * n, [rng.randint(9, max_prompt) for _ in range(n)], [n + 1 + i for i in range(n)],
                     seed, vocab)

    def spread(n, seed, rate):
        return poisson(num_requests=n, rate=rate, min_in=9, max_in=max_prompt, min_out=2, max_out=outputs, seed=seed)

    mlx = lambda step, p, d: {"policy": "mlx-lm", "prefill_step": step, "prompt_concurrency": p,
                              "decode_concurrency": d}
    return {
        "train": [Workload("mlx-lm-spread", spread(7, 12, 2.0), mlx(48, 3, 4), "mlx-lm"),
                  Workload("mlx-lm-staggered", staggered(6, 11), mlx(32, 4, 4), "mlx-lm")],
        "held_out": [Workload("mlx-lm-spread-held-out", spread(6, 21, 1.5), mlx(40, 2, 3), "mlx-lm"),
                     Workload("mlx-lm-defaults-held-out", staggered(5, 22), mlx(2048, 8, 32), "mlx-lm"),
                     Workload("mlx-lm-pipelined-held-out", spread(6, 23, 1.5), mlx(40, 2, 3), "mlx-lm",
                              pipelined=True)],
    }


def calibrate_mlx_lm(model: str, grid: MlxLmGrid, out: Path, dtype: str = "float32", quant_bits: int | None = None,
                     weights: str | None = None, seed: int = 0, overwrite: bool = False, progress: bool = True,
                     any_mlx_lm: bool = False) -> dict:
    host = host_info()
    version = installed_version()
    for w in check_version(version, any_mlx_lm):
        print(f"warning: {w}")
    refuse_existing(out, overwrite)
    t0 = time.perf_counter()
    lm = build_model(model, dtype=dtype, quant_bits=quant_bits, weights=weights)
    build_s = time.perf_counter() - t0
    need = grid.max_context()
    if need > lm.max_context:
        raise UserError(f"grid needs a context of {need} tokens; {model} allows {lm.max_context}")
    longest = max(max(p) for p in grid.prompts)
    loads = workloads(min(longest + longest // 4, 160), lm.vocab_size)
    # what the partial file's measurements are of: a resume of other work is refused (calibrate.measure.journal)
    header = {"model": model, "dtype": dtype, "quant_bits": quant_bits, "weights": lm.source, "device": host["id"],
              "grid": grid.to_dict(), "seed": seed, "layout": "mlx-lm rounds+engine", "mlx_lm": version,
              "workloads": {part: [[w.name, w.trace.sha256(), w.setting] for w in ws] for part, ws in loads.items()}}
    partial = out.with_name(out.name + ".partial.jsonl")
    with Journal(partial, header) as journal:
        runs = EngineRuns(lm, loads, journal, progress)
        after = runs.schedule(grid.repeats)
        samples = run_grid(lm, grid, journal, seed=seed, progress=progress,
                           after_round=lambda r: runs.run(after[r]), profiler=MlxLmProfiler(lm, grid))
        engine = runs.records()
    groups = attention_layers(lm.config)  # the heap model follows each KV layer's arrays (`sim.engine.heap`)
    states = state_tokens(lm.config, lm.dtype)
    samples += engine_samples(engine, groups, states)
    fitted = fitted_profile(samples, engine, seed, groups, states)
    timing = {"build_s": build_s, "calibrate_s": time.perf_counter() - t0}
    # device's `mlx_lm` is the version whose BatchGenerator was timed
    return write_profile(out, lm, quant_bits, host, grid, timing, fitted, samples, engine, partial, overwrite, engine="mlx-lm")


def fitted_profile(samples: list[dict], engine: list[dict], seed: int = 0, groups: int | None = None,
                   states: int = 0) -> dict:
    """`fit_mlx_lm` of the samples, with the host work between next() calls measured in the
    fitted engine runs, and the held-out runs' share between calls. `groups`: the heap model's
    (None: a profile that predates it, replayed with `GROUPS`); `states`: a hybrid model's state
    per request (`sim.engine.memory.state_tokens`)."""
    logs = {r["name"]: relogged(Trace.from_dicts(r["trace"]["requests"], r["trace"]["meta"]), r["log"], r["setting"],
                                groups=groups or GROUPS, state_tokens=states)
            for r in engine}
    train = [logs[r["name"]] for r in engine if r["part"] == "train"]
    fitted = fit_mlx_lm(samples, iteration_of(train), seed)
    trained = [r["log"] for r in engine if r["part"] == "train"]
    host = median_by_kind(trained, "host_parts")
    if host:
        section = fitted["cost"]["mlx_lm"]
        section["host"], section["tail"] = host, median_by_kind(trained, "queue_tails")
    if groups is not None:
        fitted["cost"]["heap_groups"] = groups
    held = [r for r in engine if r["part"] == "held_out"]
    if "replay" in fitted["fit"]:
        fitted["fit"]["replay"]["between_calls_share"] = between_calls_share(
            [logs[r["name"]] for r in held if not r["log"].get("pipelined")])
    piped = [logs[r["name"]] for r in held if r["log"].get("pipelined")]
    if piped and host:
        fitted["fit"]["pipelined_replay"] = pipelined_replay(piped, fitted["cost"]["mlx_lm"])
    return fitted


def median_by_kind(logs: list[dict], key: str) -> dict[str, float]:
    """A per-kind figure the engine runs measured (`key`: "host_parts" or "queue_tails" of
    `EventLog`; `sim.engine.pipeline`), the median over the runs that have it (none in runs from
    before it, whose profiles then price calls one after another)."""
    parts: dict[str, list[float]] = {}
    for log in logs:
        for kind, v in (log.get(key) or {}).items():
            parts.setdefault(kind, []).append(v)
    return {k: statistics.median(v) for k, v in parts.items()}


def refit_mlx_lm(prof: dict, seed: int = 0) -> dict:
    """An mlx-lm profile's grid samples and engine runs fitted again (today's KV rules and forms)."""
    groups, states = prof["cost"].get("heap_groups"), profile_state_tokens(prof)
    samples = [s for s in prof["samples"] if "source" not in s] + engine_samples(prof.get("engine_runs", []),
                                                                                 groups or GROUPS, states)
    prof["samples"] = samples
    return fitted_profile(samples, prof.get("engine_runs", []), seed, groups, states)

