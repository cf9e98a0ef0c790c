"""`pdsim sweep`: replay traces under a grid of settings, pick the best one under SLO constraints."""
from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

from sim.commands.common import (add_policy_args, add_profile_args, add_trace_args, cost_from_args,
                                 positive_float, positive_int, settings_from_args, trace_from_args)
from sim.files import ExistsError, atomic_write_json, atomic_write_text
from sim.metrics import parse_slo
from sim.pick import (Constraint, Objective, Pick, check_names, default_latency, parse_objective, pick, split_slo,
                      throughput_of)
from sim.sweep import Inputs, Point, SweepError, grid, known_metrics, run_points, run_sweep
from sim.table import table
from traces.generators import GENERATORS

GRID_OPTIONS = ("--trace", "--policy", "--budget", "--batch-size", "--decode", "--order", "--prefill-step",
                "--prompt-concurrency", "--decode-concurrency")
RESULTS = ("results.csv", "results.json")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="replay traces under a grid of settings in parallel; pick the best under SLOs",
        description="Simulate every combination of the given traces, arrival-rate scales, policies, budgets, "
                    "batch sizes, decode modes and orders (in local processes, or on a Dask cluster), write "
                    "one row of metrics per run, and pick the setting that best meets the SLO constraints.")
    add_trace_args(p)
    add_policy_args(p, many=True)
    _grid_nargs(p)
    p.add_argument_group("traffic grid").add_argument(
        "--rate-scale", nargs="*", type=positive_float, default=[1.0], metavar="F",
        help="replay each trace at several arrival rates: arrivals F times as fast (default 1)")
    add_profile_args(p)
    g = p.add_argument_group("picking")
    g.add_argument("--slo", nargs="+", default=[], metavar="CONSTRAINT",
                   help="METRIC<=X or METRIC>=X constrains the pick (e.g. decode_gap_p95_ms<=50 "
                        "p99_ttft_ms<=2000); KEY:MS is a per-request goodput target (ttft:2000 tpot:100)")
    g.add_argument("--objective", default="max:output_tok_s", type=parse_objective, metavar="max|min:METRIC",
                   help="what the pick optimizes among settings meeting every constraint (default max:output_tok_s)")
    g.add_argument("--latency", metavar="METRIC",
                   help="latency axis of the Pareto front (default: the first METRIC<=X constraint on a _ms "
                        "metric, else decode_gap_p95_ms)")
    g.add_argument("--top", type=positive_int, default=3, help="runners-up to show (default 3)")
    g.add_argument("--stall-ms", type=positive_float, default=100.0,
                   help="a gap above this counts as a stall (default 100 ms)")
    r = p.add_argument_group("running")
    r.add_argument("--workers", type=positive_int, help="local worker processes (default: one per core)")
    r.add_argument("--scheduler", metavar="ADDRESS",
                   help="run on a Dask cluster instead, e.g. tcp://10.0.0.5:8786 (pdsim installed on its workers)")
    r.add_argument("--connect-timeout", type=positive_float, default=10.0,
                   help="seconds to wait for the Dask scheduler (default 10)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--out", metavar="OUTDIR", help="write results.csv and results.json here")
    o.add_argument("--logs", nargs="?", type=positive_int, const=3, default=0, metavar="N",
                   help="also save the event logs of the best N settings per group under OUTDIR/logs "
                        "(default N 3), for the report's timeline; large for long traces")
    o.add_argument("--overwrite", action="store_true", help="replace existing results in OUTDIR")


def _grid_nargs(p: argparse.ArgumentParser) -> None:
    """Grid options take several values; an empty one is reported by `run` in one line."""
    for action in p._actions:
        if set(action.option_strings) & set(GRID_OPTIONS):
            action.nargs = "*"
            if action.option_strings == ["--trace"]:
                action.default = ["tinyllm"]
                action.help = "one or more generators (tinyllm, poisson, gamma, metile) or trace files " \
                              "(default: tinyllm)"


def traces_from_args(args: argparse.Namespace) -> dict:
    """Each --trace value resolved with the shared generator options, by a short unique name."""
    out = {}
    for spec in args.trace:
        name = spec if spec in GENERATORS else Path(spec).stem
        if name in out:
            name = f"{name}-{len(out)}"
        out[name] = trace_from_args(argparse.Namespace(**dict(vars(args), trace=spec)))
    return out


def run(args: argparse.Namespace) -> int:
    for opt in GRID_OPTIONS + ("--rate-scale",):
        if not getattr(args, opt[2:].replace("-", "_")):
            raise SweepError(f"empty grid: {opt} was given no values")
    goodput_items, constraints = split_slo(args.slo)
    slo = parse_slo(goodput_items) if goodput_items else None
    objective: Objective = args.objective
    latency = args.latency or default_latency(constraints)
    check_names(constraints, objective, latency,
                known_metrics(goodput=slo is not None) + ["budget", "batch_size", "rate_scale"], slo is not None)
    settings = settings_from_args(args)
    out = Path(args.out) if args.out else None
    if out and not args.overwrite:
        for name in RESULTS:
            if (out / name).exists():
                raise ExistsError(f"{out / name} exists; not overwriting it (pass --overwrite, or another -o)")
    traces = traces_from_args(args)
    prof, _ = cost_from_args(args)
    inputs = Inputs(traces, prof, slo, args.stall_ms)
    points = grid(settings, traces, args.rate_scale)
    where = f"Dask at {args.scheduler}" if args.scheduler else \
        f"{min(args.workers or (os.cpu_count() or 1), len(points))} local process(es)"
    print(f"sweep: {len(settings)} setting(s) x {len(traces)} trace(s) x {len(args.rate_scale)} rate scale(s) "
          f"= {len(points)} runs on {where}")
    for name, tr in traces.items():
        print(f"  trace {name}: {len(tr)} requests, sha256 {inputs.sha256[name][:12]}")
    t0 = time.perf_counter()
    df = run_sweep(points, inputs, args.workers, args.scheduler, not args.no_progress, args.connect_timeout)
    wall = time.perf_counter() - t0
    print(f"swept {len(points)} runs in {wall:.1f} s")

    picks = pick(df, constraints, objective, latency, throughput_of(objective), args.top)
    for pk in picks:
        print_pick(pk, constraints, objective, latency, len(traces) * len(args.rate_scale) > 1)
    if out is None:
        print("\nresults not saved (pass -o OUTDIR to write results.csv and results.json)")
        return 0
    logs = save_logs(out, picks, points, inputs, args) if args.logs else []
    doc = {"pdsim_sweep": 1, "inputs": {
        "traces": [{"name": n, "sha256": inputs.sha256[n], "meta": t.meta, "requests": len(t)}
                   for n, t in traces.items()],
        "profile": prof.get("_path"), "profile_model": prof["model"], "profile_device": prof["device"],
        "illustrative_profile": bool(prof.get("illustrative")),
        "grid": {"policy": args.policy, "budget": args.budget, "batch_size": args.batch_size,
                 "decode": args.decode, "order": args.order, "rate_scale": args.rate_scale,
                 "prefill_step": args.prefill_step, "prompt_concurrency": args.prompt_concurrency,
                 "decode_concurrency": args.decode_concurrency,
                 "setting": getattr(args, "setting", None)},
        "settings": settings, "slo": {"goodput": goodput_items, "constraints": [str(c) for c in constraints]},
        "stall_ms": args.stall_ms, "objective": str(objective), "latency": latency,
        "throughput": throughput_of(objective), "executor": where},
        "wall_s": wall, "picks": [pick_doc(pk) for pk in picks], "logs": logs,
        "rows": json.loads(df.to_json(orient="records", double_precision=15))}
    atomic_write_text(out / "results.csv", df.to_csv(index=False), overwrite=args.overwrite)
    atomic_write_json(out / "results.json", doc, overwrite=args.overwrite)
    print(f"\nwrote {out / 'results.csv'}, {out / 'results.json'}" + (f" and {len(logs)} log(s)" if logs else ""))
    return 0


def shown_metrics(constraints: list[Constraint], objective: Objective, latency: str) -> list[str]:
    cols = [objective.metric, latency] + [c.metric for c in constraints]
    cols += ["output_tok_s", "decode_gap_p95_ms", "p99_ttft_ms"]
    return list(dict.fromkeys(cols))


def print_pick(pk: Pick, constraints: list[Constraint], objective: Objective, latency: str,
               name_group: bool) -> None:
    cols = shown_metrics(constraints, objective, latency)
    group = ", ".join(f"{k} {v}" for k, v in pk.group.items())
    subject = f" subject to {', '.join(map(str, constraints))}" if constraints else ""
    print(f"\n== {group}: " if name_group else "\n", end="")
    print(f"{objective}{subject}: {pk.feasible} of {pk.total} settings qualify")
    if pk.best is None:
        print("no setting meets every constraint; loosen --slo, or widen the grid")
    else:
        print(f"pick: {pk.best['label']}  " + "  ".join(f"{c} {_fmt(pk.best[c])}" for c in cols))
        if len(pk.runners_up):
            print("runners-up:")
            print(table(pk.runners_up.to_dict("records"), ["label"] + cols))
    print(f"Pareto front ({throughput_of(objective)} vs {latency}):")
    front = pk.front.to_dict("records")
    print(table(front, ["label", latency, throughput_of(objective)]) if front else "  (no finite points)")


def _fmt(v) -> str:
    from sim.table import fmt
    return fmt(float(v)) if isinstance(v, (int, float)) else str(v)


def pick_doc(pk: Pick) -> dict:
    return {"group": pk.group, "best": None if pk.best is None else pk.best["label"],
            "runners_up": list(pk.runners_up["label"]), "front": list(pk.front["label"]),
            "feasible": pk.feasible, "total": pk.total}


def save_logs(out: Path, picks: list[Pick], points: list[Point], inputs: Inputs, args) -> list[dict]:
    """Re-run the best few settings of each group keeping their event logs; write one JSON each."""
    chosen = []
    for pk in picks:
        if pk.best is None:
            continue
        labels = [pk.best["label"]] + list(pk.runners_up["label"])[:args.logs - 1]
        for rank_, label in enumerate(labels):
            p = next(p for p in points if p.label == label and all(getattr(p, k) == v for k, v in pk.group.items()))
            chosen.append((rank_, p))
    if not chosen:
        return []
    files = []
    for _, p in chosen:
        path = out / "logs" / f"{_slug(p.trace)}-x{p.rate_scale:g}-{_slug(p.label)}.json"
        if path.exists() and not args.overwrite:
            raise ExistsError(f"{path} exists; not overwriting it (pass --overwrite, or another -o)")
        files.append(path)
    print(f"keeping the event logs of {len(chosen)} setting(s) (re-running them)")
    results = run_points([p for _, p in chosen], inputs, args.workers, args.scheduler, keep_logs=True,
                         progress=not args.no_progress, connect_timeout=args.connect_timeout)
    doc = []
    for (rank_, p), path, (metrics, log) in zip(chosen, files, results):
        atomic_write_json(path, {"label": p.label, "setting": p.setting, "rank": rank_,
                                 "trace": {"name": p.trace, "sha256": inputs.sha256[p.trace]},
                                 "rate_scale": p.rate_scale, "metrics": metrics, "log": log},
                          overwrite=args.overwrite)
        doc.append({"file": str(path.relative_to(out)), "label": p.label, "trace": p.trace,
                    "rate_scale": p.rate_scale, "rank": rank_})
    return doc


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")
