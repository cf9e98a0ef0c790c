"""Calibration end to end: build the model, time the grid, fit, write the profile."""
from __future__ import annotations

import shutil
import time
from itertools import zip_longest
from pathlib import Path

from calibrate.profile_paths import default_profile_path, stamp
from calibrate.fit.pdsim import HELD_OUT, fit_profile
from calibrate.measure.grid import Grid
from calibrate.host.machine import host_info
from calibrate.engine.model import LoadedModel, build_as_profiled, build_model, weights_bytes
from calibrate.measure.journal import Journal
from calibrate.fit.memory import fit_memory, model_config
from calibrate.measure.profiler import merge, run_grid, typical_time
from calibrate.measure.speed_probe import PREFILLS, dear_page_seconds, reference_probes, timed_in_place, timed_speed
from calibrate.measure.engine_runs import Workload, between_calls_share, relogged, run_workloads, samples_from_log, workloads
from calibrate.measure.worker import warmed_with
from sim.cost.profile import cost_model, load_profile
from sim.engine.log import EventLog
from sim.cost.speed import MachineSpeed
from sim.engine.memory import profile_kv_bytes
from sim.engine.work import EngineError
from traces.trace import Trace
from sim.core.errors import UserError
from sim.core.files import atomic_write_json
from sim.core.inputs import read_json_object
from sim.core.outdir import file_sha256


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
    samples += engine_samples(engine)
    fitted = fit_profile(samples, seed=seed, page=dear_page_seconds(reference_probes({"engine_runs": engine})))
    fitted["fit"]["replay"]["between_calls_share"] = between_calls_share(
        [EventLog.from_dict(r["log"]) for r in engine if r["part"] == "held_out"])
    fitted["memory"] = fit_memory(samples, dict(lm.config, dtype=lm.dtype), weights_bytes(lm), engine, seed)
    timing = {"build_s": build_s, "calibrate_s": time.perf_counter() - t0}
    return write_profile(out, lm, quant_bits, host, grid, timing, fitted, samples, engine, partial, overwrite)


def write_profile(out: Path, lm: LoadedModel, quant_bits: int | None, host: dict, grid, timing: dict, fitted: dict,
                  samples: list[dict], runs: list[dict], partial: Path, overwrite: bool, **extra) -> dict:
    """A calibration's profile (pdsim's or mlx-lm's, `extra` its own fields; `quant_bits` as asked
    for, None for weights quantized already), written atomically;
    the partial file it was measured into goes only once the profile is safe."""
    prof = {
        "pdsim_profile": 1,
        "illustrative": False,
        **extra,
        "created": stamp(),
        "model": {"name": lm.name, "shapes": lm.config, "dtype": lm.dtype, "quant_bits": quant_bits,
                  "weights": lm.source, "max_context": lm.max_context},
        "device": host,
        "grid": grid.to_dict(),
        **timing,
        **fitted,
        "samples": samples,
        "engine_runs": runs,
    }
    atomic_write_json(out, prof, overwrite=overwrite)
    partial.unlink(missing_ok=True)
    prof["_path"] = str(out)
    return prof


class EngineRuns:
    """The calibration's engine workloads (`calibrate.measure.engine_runs`), each run once, between the grid's
    rounds: the machine's speed drifts over minutes, and runs timed after the whole grid would
    see another machine than the grid did. A finished run's log is kept in the partial file, so
    an interrupted calibration does not run it again."""

    def __init__(self, lm: LoadedModel, loads: dict[str, list[Workload]], journal: Journal, progress: bool = True):
        self.loads, self.journal, self.partial, self.progress = loads, journal, journal.path, progress
        self.model = {"name": lm.name, "dtype": lm.dtype, "quant_bits": lm.quant_bits, "weights": lm.source}
        self.done: dict[str, dict] = {}
        self.probes: dict[str, dict] = {}

    def schedule(self, rounds: int) -> list[list[Workload]]:
        """Which workloads run after each round: train and held-out ones alternating, spread evenly."""
        parts = list(self.loads.values())
        order = [w for group in zip_longest(*parts) for w in group if w is not None]
        return [order[len(order) * r // rounds:len(order) * (r + 1) // rounds] for r in range(rounds)]

    def run(self, loads: list[Workload]) -> None:
        self._read()
        todo = [w for w in loads if w.name not in self.done]
        folder = self.partial.with_name(self.partial.name + ".runs")
        for w, (log, probe) in zip(todo, run_workloads(self.model, todo, folder, self.progress)):  # saved as each ends
            self.done[w.name], self.probes[w.name] = log, probe
            self.journal.append({"workload": w.name, "log": log, "probe": probe})

    def records(self) -> list[dict]:
        """Every workload's run (running any not run yet): its part (train, held_out), setting,
        trace, log and speed probe, as the profile keeps them (`engine_samples` derives the
        samples again; a confirm times its probes against these, `calibrate.measure.speed_probe`)."""
        self.run([w for ws in self.loads.values() for w in ws])
        shutil.rmtree(self.partial.with_name(self.partial.name + ".runs"), ignore_errors=True)
        return [{"name": w.name, "part": part, "setting": w.setting, "trace": w.trace.to_dict(),
                 "log": self.done[w.name], **({"probe": self.probes[w.name]} if w.name in self.probes else {})}
                for part, ws in self.loads.items() for w in ws]

    def _read(self) -> None:
        for row in self.journal.records:
            if "workload" not in row:
                continue  # the grid's timings
            try:
                EventLog.from_dict(row["log"])  # a whole log, or skip it
                self.done.setdefault(row["workload"], row["log"])
                if row.get("probe"):  # partial files before stop 25 kept none
                    self.probes.setdefault(row["workload"], row["probe"])
            except (KeyError, TypeError, ValueError):
                continue


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
                                                             profile_kv_bytes(prof), warmed_with(d)[1]),
                                                    f"run:{r.name}:{run['label']}:r{run['repeat']}"), speed(run))]
    prof.pop("_path")
    prof["samples"] = prof["samples"] + added
    prof.update(refitted(prof, prof["samples"], seed), from_runs=[str(r) for r in reports], refit_of=str(source),
                created=stamp())
    atomic_write_json(out, prof, overwrite=overwrite)
    prof["_path"] = str(out)
    return prof, before


def engine_samples(runs: list[dict]) -> list[dict]:
    """The calls of the calibration's engine runs as samples (held-out runs marked), their KV
    buffers derived from the calls by today's state machine (`sim.engine.relog`), so a refit of an
    older profile prices them by today's rules; each call's time at the calibration's speed
    (`run_speeds`: `speed` the factor applied, `measured` the time as timed)."""
    out, speeds = [], run_speeds(runs)
    for r in runs:
        log = relogged(Trace.from_dicts(r["trace"]["requests"], r["trace"]["meta"]), r["log"], r["setting"])
        out += brought_back(samples_from_log(log, (HELD_OUT if r["part"] == "held_out" else "engine:") + r["name"]),
                            speeds.get(r["name"]))
    return out


def brought_back(samples: list[dict], speed: MachineSpeed | None) -> list[dict]:
    """Samples of a run timed at `speed` (None: the calibration's), their times at the
    calibration's speed: prefill chunks by the prefill speed, every other call by the decode speed."""
    out = []
    for s in samples:
        f = 1.0 if speed is None else speed.prefill if s["step"] in PREFILLS else speed.decode
        out.append(dict(s, seconds=s["seconds"] * f, measured=s["seconds"], speed=f) if f != 1.0 else s)
    return out


def run_speeds(runs: list[dict]) -> dict[str, MachineSpeed]:
    """Each engine run's machine speed against the calibration's: the probes served just before
    and after it timed against the median over every run's probes (`timed_speed`, no price in
    it; profiles from before the probe after have the one before only). A shared
    VM slows down for minutes at a time (one held-out run here at 0.77x on prefills, 0.84x on
    decodes, the others at 0.99-1.06x): unadjusted, its replay table reads the slowdown as the
    model's error, and a slowed training run moves the join and leave prices fitted from its
    calls. A probe lasts about 6 s: one before the run alone over-corrected by 7-10% there, and
    in another calibration read 0.72x for a run that ran at 1.0x."""
    probes = {r["name"]: [EventLog.from_dict(d) for d in r["probe"]["logs"]]
              for r in runs if (r.get("probe") or {}).get("logs")}
    reference = [log for logs in probes.values() for log in logs]
    speeds = {name: timed_speed(logs, reference) for name, logs in probes.items()} if len(probes) > 1 else {}
    return {name: s for name, s in speeds.items() if s is not None}


def refitted(prof: dict, samples: list[dict], seed: int) -> dict:
    """`fit_profile` of these samples; what the engine replay measured besides its calls (the time
    between calls) is a measurement, not a fit, and is kept. A profile that keeps its engine runs
    has their samples derived again (`engine_samples`)."""
    if prof.get("engine") == "mlx-lm":
        from calibrate.mlxlm_calibration import refit_mlx_lm
        return refit_mlx_lm(prof, seed)
    samples = [dict(s, seconds=typical_time(s["times"])) if "source" not in s and len(s.get("times") or ()) > 1
               else s for s in samples]  # a grid point's time from its rounds by today's rule
    if prof.get("engine_runs"):  # in the order calibrate writes them: grid, engine runs, then any others
        engine = lambda s: s.get("source", "").startswith(("engine:", HELD_OUT))
        try:
            derived = engine_samples(prof["engine_runs"])
        except (KeyError, TypeError, ValueError, IndexError, EngineError) as e:  # a damaged run (schema-valid)
            raise UserError(f"profile {prof.get('_path') or prof.get('refit_of') or ''}: its engine_runs cannot be "
                            f"replayed ({type(e).__name__}: {e})") from None
        samples = ([s for s in samples if "source" not in s] + derived
                   + [s for s in samples if "source" in s and not engine(s)])
    prof["samples"] = samples
    new = fit_profile(samples, seed=seed, page=dear_page_seconds(reference_probes(prof)))
    if (prof.get("memory") or {}).get("weights_bytes") is not None:  # profiles before it measured no peaks
        new["memory"] = fit_memory(samples, model_config(prof["model"]), prof["memory"]["weights_bytes"],
                                   prof.get("engine_runs") or [], seed)
    old = prof.get("fit", {}).get("replay", {})
    if "replay" in new["fit"] and "between_calls_share" in old:
        new["fit"]["replay"]["between_calls_share"] = old["between_calls_share"]
    return new


def check_grid(grid: Grid, model: str) -> None:
    """Before building anything: a grid the fit can use, within the model's context."""
    from calibrate.engine.model import QWEN3_CONFIGS
    for name in ("chunks", "offsets", "batches", "contexts"):
        if not getattr(grid, name):
            raise UserError(f"the grid has no {name}")
    limit = QWEN3_CONFIGS.get(model, {}).get("max_position_embeddings")
    if limit and grid.max_context() > limit:
        raise UserError(f"grid needs a context of {grid.max_context()} tokens; {model} allows {limit}")


def refuse_existing(out: Path, overwrite: bool) -> None:
    """Before any measuring: an existing profile is replaced only when the user asks."""
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; not overwriting it (pass --overwrite, or choose another path)")
