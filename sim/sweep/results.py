"""A sweep from request to files: run the grid, pick per (trace, rate scale), keep logs, write results.

`pdsim sweep` and `pdsim tune` both call these; the command line only parses and prints.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sim.core.files import atomic_write_json, atomic_write_text, jsonable
from sim.core.outdir import file_sha256
from sim.engine.log import EventLog
from sim.metrics import registry
from sim.metrics.scoring import Slo, parse_slo
from sim.sweep.pick import Constraint, Objective, Pick, check_names, default_latency, pick, split_slo, throughput_of
from sim.sweep.run import Inputs, Point, grid, run_points, run_sweep
from traces.trace import Trace

RESULTS = ("results.csv", "results.json")


@dataclass
class SweepPlan:
    """What to sweep and how to pick: every name checked before anything runs."""
    traces: dict[str, Trace]
    settings: list[dict]
    profile: dict
    rate_scales: list[float] = field(default_factory=lambda: [1.0])
    slo: list[str] = field(default_factory=list)  # KEY:MS goodput targets and METRIC<=X constraints
    objective: Objective = field(default_factory=Objective)
    latency: str | None = None  # the front's latency axis; None: `default_latency`
    stall_ms: float = 100.0
    top: int = 3
    goodput: list[str] = field(init=False)
    constraints: list[Constraint] = field(init=False)

    def __post_init__(self) -> None:
        self.goodput, self.constraints = split_slo(self.slo)
        self.latency = registry.canonical(self.latency) if self.latency else default_latency(self.constraints)
        check_names(self.constraints, self.objective, self.latency, bool(self.goodput))

    @property
    def targets(self) -> Slo | None:
        return parse_slo(self.goodput) if self.goodput else None

    @property
    def throughput(self) -> str:
        return throughput_of(self.objective)

    def inputs(self) -> Inputs:
        return Inputs(self.traces, self.profile, self.targets, self.stall_ms)

    def points(self) -> list[Point]:
        return grid(self.settings, self.traces, self.rate_scales)


@dataclass
class SweepResult:
    plan: SweepPlan
    inputs: Inputs
    points: list[Point]
    df: pd.DataFrame
    picks: list[Pick]
    wall_s: float


def run_plan(plan: SweepPlan, workers: int | None = None, scheduler=None, progress: bool = True,
             connect_timeout: float = 10.0, inputs: Inputs | None = None) -> SweepResult:
    """Every point of the plan, then the pick of each (trace, rate scale) group."""
    inputs, points = inputs or plan.inputs(), plan.points()
    t0 = time.perf_counter()
    df = run_sweep(points, inputs, workers, scheduler, progress, connect_timeout)
    wall = time.perf_counter() - t0
    picks = pick(df, plan.constraints, plan.objective, plan.latency, plan.throughput, plan.top)
    return SweepResult(plan, inputs, points, df, picks, wall)


RESULT_NAMES = RESULTS + ("logs",)  # what a sweep owns in its folder


def log_points(result: SweepResult, n: int) -> list[tuple[int, Point]]:
    """(rank, point) of the best `n` settings of each group that has a pick."""
    chosen = []
    for pk in result.picks:
        if pk.best is None:
            continue
        labels = [pk.best["label"]] + list(pk.runners_up["label"])[:n - 1]
        for rank_, label in enumerate(labels):
            p = next(p for p in result.points
                     if p.label == label and all(getattr(p, k) == v for k, v in pk.group.items()))
            chosen.append((rank_, p))
    return chosen


def log_path(out: Path, p: Point) -> Path:
    return out / "logs" / f"{_slug(p.trace)}-x{p.rate_scale:g}-{_slug(p.label)}.npz"


def save_logs(result: SweepResult, out: Path, chosen: list[tuple[int, Point]], workers: int | None = None,
              scheduler=None, progress: bool = True, connect_timeout: float = 10.0, into: Path | None = None) -> list[dict]:
    """Re-run the chosen points keeping their event logs: one columnar file each under
    `into/logs` (the staging folder of `out`; `sim.metrics.logfile`), written by the local workers as
    they run (on Dask, the logs come back and are written here)."""
    if not chosen:
        return []
    into = into or out
    files = [log_path(into, p) for _, p in chosen]
    files[0].parent.mkdir(parents=True, exist_ok=True)
    inputs = result.inputs
    keep = True if scheduler is not None else [str(f) for f in files]
    results = run_points([p for _, p in chosen], inputs, workers, scheduler, keep_logs=keep, progress=progress,
                         connect_timeout=connect_timeout)
    doc = []
    for (rank_, p), path, (metrics, log) in zip(chosen, files, results):
        meta = {"label": p.label, "setting": p.setting, "rank": rank_,
                "trace": {"name": p.trace, "sha256": inputs.sha256[p.trace]}, "rate_scale": p.rate_scale,
                "metrics": metrics}
        if isinstance(log, dict):  # from a Dask worker (a local one wrote the file itself, `sweep.evaluate`)
            from sim.metrics.logfile import write_log
            write_log(path, EventLog.from_dict(log), meta, overwrite=True)
        doc.append({"file": str(path.relative_to(into)), "label": p.label, "trace": p.trace,
                    "trace_sha256": inputs.sha256[p.trace], "rate_scale": p.rate_scale, "rank": rank_})
    return doc


def pick_doc(pk: Pick) -> dict:
    return {"group": pk.group, "best": None if pk.best is None else pk.best["label"],
            "runners_up": list(pk.runners_up["label"]), "front": list(pk.front["label"]),
            "feasible": pk.feasible, "total": pk.total}


def results_doc(result: SweepResult, grid_options: dict, executor: str, logs: list[dict]) -> dict:
    """results.json: what was swept (traces by SHA-256, profile, grid, targets), picks, rows."""
    plan, inputs = result.plan, result.inputs
    prof = plan.profile
    return {"pdsim_sweep": 1, "inputs": {
        "traces": [{"name": n, "sha256": inputs.sha256[n], "meta": t.meta, "requests": len(t)}
                   for n, t in plan.traces.items()],
        "profile": prof.get("_path"), "profile_model": prof["model"], "profile_device": prof["device"],
        "illustrative_profile": bool(prof.get("illustrative")),
        "grid": dict(grid_options, rate_scale=plan.rate_scales),
        "settings": plan.settings, "slo": {"goodput": plan.goodput, "constraints": [str(c) for c in plan.constraints]},
        "stall_ms": plan.stall_ms, "objective": str(plan.objective), "latency": plan.latency,
        "throughput": plan.throughput, "executor": executor},
        "wall_s": result.wall_s, "picks": [pick_doc(pk) for pk in result.picks], "logs": logs,
        "rows": jsonable(result.df.to_dict(orient="records"))}


def write_results(into: Path, doc: dict, df: pd.DataFrame) -> None:
    """results.csv, then results.json naming the SHA-256 of results.csv and of every log it lists
    (`digests`), so the set can be proven whole (`sim.core.outdir`); into the sweep's staging folder."""
    atomic_write_text(into / "results.csv", df.to_csv(index=False))
    digests = {"results.csv": file_sha256(into / "results.csv")}
    digests |= {entry["file"]: file_sha256(into / entry["file"]) for entry in doc.get("logs", [])}
    atomic_write_json(into / "results.json", dict(doc, digests=digests))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")
