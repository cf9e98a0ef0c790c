"""Calibration end to end: build the model, time the grid, fit, write the profile."""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from calibrate.engine.model import build_as_profiled, build_model, is_hybrid, weights_bytes
from calibrate.fit.common import HELD_OUT
from calibrate.fit.memory import fit_memory, model_config
from calibrate.fit.pdsim import fit_profile
from calibrate.host.machine import host_info
from calibrate.measure.engine_runs import (
    EngineRuns,
    between_calls_share,
    brought_back,
    engine_samples,
    relogged,
    samples_from_log,
    workloads,
)
from calibrate.measure.grid import Grid
from calibrate.measure.journal import Journal
from calibrate.measure.profiler import merge, point_time, run_grid
from calibrate.measure.speed_probe import dear_page_seconds, reference_probes, timed_in_place
from calibrate.measure.worker import warmed_with
from calibrate.mlxlm_calibration import refit_mlx_lm
from calibrate.profiles import default_profile_path, refuse_existing, stamp, write_profile
from sim.core.errors import UserError
from sim.core.files import atomic_write_json
from sim.core.inputs import read_json_object
from sim.core.outdir import file_sha256
from sim.cost.profile import cost_model, load_profile
from sim.engine.heap import GROUPS
from sim.engine.log import EventLog
from sim.engine.memory import attention_layers, profile_kv_bytes, profile_state_tokens, state_tokens
from sim.engine.work import EngineError
from traces.trace import Trace


def calibrate(model: str, grid: Grid, out: Path | None, dtype: str = "float32", quant_bits: int | None = None,
              weights: str | None = None, seed: int = 0, overwrite: bool = False, progress: bool = True) -> dict:
    host = host_info()
    out = out or default_profile_path(model, host["kind"])
    refuse_existing(out, overwrite)
    check_grid(grid, model)
    t0 = time.perf_counter()
    lm = build_model(model, dtype=dtype, quant_bits=quant_bits, weights=weights)
    build_s = time.perf_counter() - t0
    need = grid.max_context()
    if need > lm.max_context:
        raise UserError(f"grid needs a context of {need} tokens; {model} allows {lm.max_context}")
    loads = workloads(max(grid.batches), grid.longest_prompt(), lm.vocab_size)
    if is_hybrid(lm.config):  # vLLM's fused forward runs dense models only (`calibrate.engine.mixed`)
        grid = replace(grid, fused=[])
        loads = {part: [w for w in ws if w.setting["policy"] != "vllm"] for part, ws in loads.items()}
    # what the partial file's measurements are of: a resume of other work is refused (calibrate.measure.journal)
    header = {"model": model, "dtype": dtype, "quant_bits": quant_bits, "weights": lm.source,
              "device": host["id"], "grid": grid.to_dict(), "seed": seed, "layout": "rounds+engine",
              "workloads": {part: [[w.name, w.trace.sha256(), w.setting] for w in ws] for part, ws in loads.items()}}
    partial = out.with_name(out.name + ".partial.jsonl")
    with Journal(partial, header) as journal:
        runs = EngineRuns(lm, loads, journal, progress)
        after = runs.schedule(grid.repeats)
        samples = run_grid(lm, grid, journal, seed=seed, progress=progress, after_round=lambda r: runs.run(after[r]))
        engine = runs.records()
    groups = attention_layers(lm.config)  # the heap model follows each KV layer's arrays (`sim.engine.heap`)
    samples += engine_samples(engine, groups, state_tokens(lm.config, lm.dtype))
    fitted = fit_profile(samples, seed=seed, page=dear_page_seconds(reference_probes({"engine_runs": engine})))
    fitted["cost"]["heap_groups"] = groups
    fitted["fit"]["replay"]["between_calls_share"] = between_calls_share(
        [EventLog.from_dict(r["log"]) for r in engine if r["part"] == "held_out"])
    fitted["memory"] = fit_memory(samples, dict(lm.config, dtype=lm.dtype), weights_bytes(lm), engine, seed)
    timing = {"build_s": build_s, "calibrate_s": time.perf_counter() - t0}
    return write_profile(out, lm, quant_bits, host, grid, timing, fitted, samples, engine, partial, overwrite)


def refit(source: Path, out: Path, seed: int = 0, overwrite: bool = False) -> dict:
    """Fit the samples of an existing profile again (no measuring) and write the result to `out`."""
    prof = load_profile(source)
    if "samples" not in prof:
        raise UserError(f"profile {source} has no samples to fit (the built-in illustrative one has none)")
    new = refitted(prof, prof["samples"], seed)
    prof.pop("_path")
    prof.update(new, refit_of=str(source), created=stamp())
    atomic_write_json(out, prof, overwrite=overwrite)
    prof["_path"] = str(out)
    return prof


def add_rounds(source: Path, out: Path, rounds: int | None = None, steps: list[str] | None = None, seed: int = 0,
               overwrite: bool = False, progress: bool = True) -> dict:
    """Time more rounds of an existing calibration's points (all, or those of `steps`) and fit
    every round together: a median over more rounds, spread over more time, is steadier where
    timing noise holds the fit back. The source profile is left as it was."""
    t0 = time.perf_counter()
    prof = load_profile(source)
    if not prof.get("samples") or "grid" not in prof:
        raise UserError(f"profile {source} has no measured samples to add rounds to")
    refuse_existing(out, overwrite)
    untimed = [i for i, s in enumerate(prof["samples"]) if "key" in s and "times" not in s]
    if untimed or not any("times" in s for s in prof["samples"]):
        where = f"samples[{untimed[0]}] has a key but no 'times'" if untimed else "no sample has its 'times'"
        raise UserError(f"profile {source}: {where}; rounds can only be added to a calibration that kept each "
                        "round's timing")
    here = host_info()["id"]
    if prof["device"].get("id") != here:
        raise UserError(f"profile {source} was measured on {prof['device'].get('id')!r}, this is {here!r}: "
                        "rounds from two devices do not mix")
    lm = build_as_profiled(prof["model"])
    grid = Grid(**prof["grid"])
    first = max(len(s["times"]) for s in prof["samples"] if "times" in s)
    n = rounds or grid.repeats
    keys = {s["key"] for s in prof["samples"] if "key" in s and (not steps or s["step"] in steps)}
    header = {"add_to": str(source), "created": prof.get("created"), "profile_sha256": file_sha256(source),
              "rounds": [first, first + n],
              "keys": sorted(keys), "seed": seed, "layout": "rounds"}
    partial = out.with_name(out.name + ".partial.jsonl")
    more = run_grid(lm, grid, partial, header, seed=seed, progress=progress, rounds=range(first, first + n), keys=keys)
    prof.pop("_path")
    prof["samples"] = merge(prof["samples"], more)
    prof.update(refitted(prof, prof["samples"], seed),
                calibrate_s=prof.get("calibrate_s", 0.0) + time.perf_counter() - t0,
                rounds_added=prof.get("rounds_added", []) + [{"created": stamp(), "rounds": n, "steps": steps or "all",
                                                               "source": str(source)}])
    atomic_write_json(out, prof, overwrite=overwrite)
    partial.unlink(missing_ok=True)
    prof["_path"] = str(out)
    return prof


def from_runs(reports: list[Path], out: Path, source: Path | None = None, seed: int = 0,
              overwrite: bool = False) -> tuple[dict, dict]:
    """Refit a profile with every call of confirm runs added to its samples (they carry shapes and
    times); return the new profile and the old `fit` section, to say how the errors changed. The
    profile is the one the first report was predicted with, unless `source` names another."""
    docs = [read_json_object(r, "confirm report", UserError) for r in reports]
    for d, r in zip(docs, reports):
        if "pdsim_confirm" not in d or not isinstance(d.get("runs"), list):
            raise UserError(f"{r}: not a confirm report (no runs)")
    source = source or Path(docs[0]["profile"].get("path") or "")
    prof = load_profile(source)
    if not prof.get("samples"):
        raise UserError(f"profile {source} has no measured samples to add runs to")
    refuse_existing(out, overwrite)
    for d, r in zip(docs, reports):
        if d["host"].get("id") != prof["device"].get("id"):
            raise UserError(f"{r} was measured on {d['host'].get('id')!r}, profile {source} on "
                            f"{prof['device'].get('id')!r}: calls from two devices do not mix")
    before = prof["fit"]
    traces = [Trace.from_dicts(d["trace"]["requests"], d["trace"]["meta"]) for d in docs]
    cost = cost_model(prof)  # what the runs' policies priced their chunks with (auto budgets)
    places = [[EventLog.from_dict(log) for log in p["logs"]] for p in reference_probes(prof)]
    speed = lambda run: timed_in_place([EventLog.from_dict(log) for log in (run.get("probe") or {}).get("logs") or []],
                                       places)  # the run's probes against the calibration's (none: as timed)
    added = [s for d, r, trace in zip(docs, reports, traces) for run in d["runs"]
             for s in brought_back(samples_from_log(relogged(trace, run["log"], run["setting"], cost,
                                                             profile_kv_bytes(prof), warmed_with(d)[1], cost.heap_groups,
                                                             cost.state_tokens),
                                                    f"run:{r.name}:{run['label']}:r{run['repeat']}"), speed(run))]
    prof.pop("_path")
    prof["samples"] = prof["samples"] + added
    prof.update(refitted(prof, prof["samples"], seed), from_runs=[str(r) for r in reports], refit_of=str(source),
                created=stamp())
    atomic_write_json(out, prof, overwrite=overwrite)
    prof["_path"] = str(out)
    return prof, before


def refitted(prof: dict, samples: list[dict], seed: int) -> dict:
    """`fit_profile` of these samples; what the engine replay measured besides its calls (the time
    between calls) is a measurement, not a fit, and is kept. A profile that keeps its engine runs
    has their samples derived again (`engine_samples`)."""
    if prof.get("engine") == "mlx-lm":
        return refit_mlx_lm(prof, seed)
    samples = [dict(s, seconds=point_time(s)) if "source" not in s and len(s.get("times") or ()) > 1
               else s for s in samples]  # a grid point's time from its rounds by today's rule
    if prof.get("engine_runs"):  # in the order calibrate writes them: grid, engine runs, then any others
        engine = lambda s: s.get("source", "").startswith(("engine:", HELD_OUT))
        try:
            derived = engine_samples(prof["engine_runs"], prof["cost"].get("heap_groups", GROUPS),
                                     profile_state_tokens(prof))
        except (KeyError, TypeError, ValueError, IndexError, EngineError) as e:  # a damaged run (schema-valid)
            raise UserError(f"profile {prof.get('_path') or prof.get('refit_of') or ''}: its engine_runs cannot be "
                            f"replayed ({type(e).__name__}: {e})") from None
        samples = ([s for s in samples if "source" not in s] + derived
                   + [s for s in samples if "source" in s and not engine(s)])
    prof["samples"] = samples
    new = fit_profile(samples, seed=seed, page=dear_page_seconds(reference_probes(prof)))
    if "heap_groups" in prof["cost"]:  # (profiles that predate it were replayed with `GROUPS`)
        new["cost"]["heap_groups"] = prof["cost"]["heap_groups"]
    if (prof.get("memory") or {}).get("weights_bytes") is not None:  # profiles before it measured no peaks
        new["memory"] = fit_memory(samples, model_config(prof["model"]), prof["memory"]["weights_bytes"],
                                   prof.get("engine_runs") or [], seed)
    old = prof.get("fit", {}).get("replay", {})
    if "replay" in new["fit"] and "between_calls_share" in old:
        new["fit"]["replay"]["between_calls_share"] = old["between_calls_share"]
    return new


def check_grid(grid: Grid, model: str) -> None:
    """Before building anything: a grid the fit can use, within the model's context."""
    from calibrate.engine.model import MODELS
    for name in ("chunks", "offsets", "batches", "contexts"):
        if not getattr(grid, name):
            raise UserError(f"the grid has no {name}")
    limit = MODELS.get(model, {}).get("max_position_embeddings")
    if limit and grid.max_context() > limit:
        raise UserError(f"grid needs a context of {grid.max_context()} tokens; {model} allows {limit}")


