"""`pdsim capacity`: for each setting of a grid, the most traffic it serves while the SLOs hold."""
from __future__ import annotations

import argparse
import time

import pandas as pd

from sim.commands.common import (
    add_policy_args,
    add_profile_args,
    add_trace_args,
    check_kv_limits,
    check_traces_fit,
    cost_from_args,
    positive_float,
    positive_int,
    settings_from_args,
    traces_from_args,
)
from sim.commands.sweep import GRID_OPTIONS, _grid_nargs
from sim.core.files import atomic_write_text, dumps, jsonable
from sim.core.outdir import OutputFolder
from sim.core.table import fmt, table
from policies.settings import setting_label
from sim.sweep.capacity import (DEFAULT_RANGE, TOLERANCE, CapacityError, Search, curve, holds, mean_rate, search,
                                 table as capacity_table)
from sim.sweep.results import SweepPlan
from sim.sweep.run import SweepError

OUTPUTS = ("capacity.json", "capacity.csv", "curve.csv")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "capacity", help="for each setting, the highest arrival rate at which every SLO still holds",
        description="Replay one trace at arrival rates found by bisection, setting by setting, and report the "
                    "highest rate at which each setting meets every --slo (vLLM's metric names, e.g. "
                    "p99_ttft_ms<=2000 decode_gap_p95_ms<=150), the setting that serves the most traffic, and why it "
                    "beats the runner-up. Runs on local processes or a Dask cluster, as `pdsim sweep` does.")
    add_trace_args(p)
    add_policy_args(p, many=True)
    _grid_nargs(p)
    p.set_defaults(trace="tinyllm")
    for action in p._actions:
        if action.option_strings == ["--trace"]:
            action.nargs, action.default = None, "tinyllm"
            action.help = "the traffic whose arrival rate is scaled: a generator or a trace file (default tinyllm)"
    add_profile_args(p)
    g = p.add_argument_group("the question")
    g.add_argument("--slo", nargs="+", required=True, metavar="CONSTRAINT",
                   help="METRIC<=X (or >=) every setting must meet, e.g. p99_ttft_ms<=2000 decode_gap_p95_ms<=150; "
                        "KEY:MS adds a per-request goodput target (ttft:2000)")
    g.add_argument("--rate-range", type=_range, default=DEFAULT_RANGE, metavar="LOW:HIGH",
                   help=f"rate scales to search, the trace's arrivals LOW to HIGH times as fast (default "
                        f"{DEFAULT_RANGE[0]:g}:{DEFAULT_RANGE[1]:g}); it must bracket every setting's capacity")
    g.add_argument("--tolerance", type=positive_float, default=TOLERANCE,
                   help=f"stop when a setting's bracket is this narrow, relative (default {TOLERANCE:g})")
    g.add_argument("--stall-ms", type=positive_float, default=100.0,
                   help="a gap above this counts as a stall (default 100 ms)")
    r = p.add_argument_group("running")
    r.add_argument("--workers", type=positive_int, help="local worker processes (default: one per core)")
    r.add_argument("--scheduler", metavar="ADDRESS", help="run on a Dask cluster instead, e.g. tcp://10.0.0.5:8786")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    o = p.add_argument_group("output")
    o.add_argument("-o", "--out", metavar="OUTDIR", help="write capacity.json, capacity.csv and curve.csv here")
    o.add_argument("--overwrite", action="store_true", help="replace existing results in OUTDIR")


def _range(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition(":")
    try:
        out = (float(lo), float(hi))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LOW:HIGH rate scales, e.g. 0.1:10, got {text!r}") from None
    if not sep or not (0 < out[0] < out[1] < float("inf")):
        raise argparse.ArgumentTypeError(f"expected 0 < LOW < HIGH, got {text!r}")
    return out


def run(args: argparse.Namespace) -> int:
    for opt in GRID_OPTIONS[1:]:
        if not getattr(args, opt[2:].replace("-", "_")):
            raise SweepError(f"empty grid: {opt} was given no values")
    plan = SweepPlan({}, [], {}, slo=args.slo)  # every name checked before a trace is read
    if not plan.constraints:
        raise CapacityError("--slo: capacity needs a METRIC<=X (or >=) constraint to hold, e.g. p99_ttft_ms<=2000")
    settings = settings_from_args(args)
    if not args.out:
        return _run(args, settings, None)
    with OutputFolder(args.out, OUTPUTS, args.overwrite, "capacity output folder") as folder:
        return _run(args, settings, folder)


def _run(args: argparse.Namespace, settings: list[dict], folder: OutputFolder | None) -> int:
    traces = traces_from_args(args)
    (name, trace), = traces.items()
    prof, _ = cost_from_args(args)
    check_traces_fit(prof, traces)
    check_kv_limits(prof, traces, settings)
    plan = SweepPlan(traces, settings, prof, slo=args.slo, stall_ms=args.stall_ms)
    inputs = plan.inputs()
    rate = mean_rate(trace)
    lo, hi = args.rate_range
    print(f"capacity: {len(settings)} setting(s) on trace {name} ({len(trace)} requests, {rate:.4g} requests/s at "
          f"scale 1), searching {lo * rate:.4g}..{hi * rate:.4g} requests/s to {args.tolerance:.0%}, under "
          + " and ".join(map(str, plan.constraints)))
    t0 = time.perf_counter()
    found = search(settings, name, inputs, plan.constraints, args.rate_range, args.tolerance, args.workers,
                   args.scheduler, not args.no_progress)
    wall = time.perf_counter() - t0
    result = summary(found, name, inputs, plan.constraints)
    print(f"searched in {wall:.1f} s ({sum(len(f.runs) for f in found)} runs)")
    print(table(result["settings"], ["label", "capacity_req_s", "breaks_at_req_s", "slo_margin", "runs"]))
    print(result["why"])
    if len(result["best_by_policy"]) > 1:
        print("each policy's best: " + "; ".join(
            f"{r['label']} {fmt(r['capacity_req_s']) if r['capacity_req_s'] is not None else 'below the range'}"
            + (" requests/s" if r["capacity_req_s"] is not None else "") for r in result["best_by_policy"].values()))
    if folder is None:
        print("\nresults not saved (pass -o OUTDIR to write capacity.json, capacity.csv and curve.csv)")
        return 0
    doc = {"pdsim_capacity": 1, "trace": {"name": name, "sha256": inputs.sha256[name], "meta": trace.meta,
                                          "requests": len(trace), "rate_req_s": rate},
           "profile": prof.get("_path"), "slo": [str(c) for c in plan.constraints], "goodput": plan.goodput,
           "rate_range": list(args.rate_range), "tolerance": args.tolerance, "wall_s": wall, **result}
    atomic_write_text(folder.staging / "capacity.csv", _csv(result["settings"]))
    curve(found, name, inputs).to_csv(folder.staging / "curve.csv", index=False)
    atomic_write_text(folder.staging / "capacity.json", dumps(jsonable(doc), indent=1) + "\n")
    folder.commit(last="capacity.json")
    print(f"\nwrote {folder.out / 'capacity.json'}, {folder.out / 'capacity.csv'}, {folder.out / 'curve.csv'}")
    return 0


def summary(found: list[Search], name: str, inputs, constraints) -> dict:
    """The settings by capacity, the pick, and why it beats the runner-up."""
    df = capacity_table(found, name, inputs, constraints)
    rows = df.to_dict("records")
    best = rows[0] if rows and rows[0]["capacity_req_s"] is not None else None
    by_policy = {}  # the side by side: each policy's best setting (rows are best first)
    for r in rows:
        by_policy.setdefault(r["policy"], r)
    return {"settings": rows, "pick": best["label"] if best else None, "why": why(found, rows, constraints),
            "best_by_policy": {p: {"label": r["label"], "capacity_req_s": r["capacity_req_s"]}
                               for p, r in by_policy.items()}}


def why(found: list[Search], rows: list[dict], constraints) -> str:
    """The pick, and what broke the runner-up where the pick still held (or, at equal capacity,
    the pick's larger margin to the SLOs)."""
    if not rows or rows[0]["capacity_req_s"] is None:
        return "no setting meets every SLO in the range"
    best = rows[0]
    line = f"pick: {best['label']} serves {fmt(best['capacity_req_s'])} requests/s"
    if len(rows) < 2 or rows[1]["capacity_req_s"] is None:
        return line + " (no other setting meets the SLOs in the range)"
    second = rows[1]
    if best["capacity_req_s"] == second["capacity_req_s"]:
        return (line + f", as many as {second['label']}; picked for its larger margin to the SLOs there "
                f"({best['slo_margin']:.1%} against {second['slo_margin']:.1%} of the nearest bound)")
    by = {setting_label(f.setting): f for f in found}
    broke = by[second["label"]]
    metrics = dict(broke.runs)[broke.hi]
    missed = [(c, metrics.get(c.metric)) for c in constraints if not holds(metrics.get(c.metric), c)]
    held = _met_at_or_above(by[best["label"]], broke.hi)
    detail = ", ".join(f"{c.metric} {_show(v)} (SLO {c.op}{c.bound:g})" for c, v in missed)
    line += (f", {best['capacity_req_s'] / second['capacity_req_s'] - 1:+.0%} more than the runner-up "
             f"{second['label']} ({fmt(second['capacity_req_s'])} requests/s), which breaks at "
             f"{fmt(second['breaks_at_req_s'])} requests/s: {detail}")
    if held is not None:
        line += "; there the pick holds " + ", ".join(f"{c.metric} {_show(held.get(c.metric))}" for c, _ in missed)
    return line


def _met_at_or_above(f: Search, scale: float) -> dict | None:
    """The pick's metrics at the lowest rate it was run at, at or above `scale`, where it met the SLOs."""
    above = sorted((r for r in f.runs if r[0] >= scale and r[0] <= f.lo), key=lambda r: r[0])
    return above[0][1] if above else None


def _show(v) -> str:
    return "unmeasured" if v is None else fmt(float(v))


def _csv(rows: list[dict]) -> str:
    return pd.DataFrame(rows).to_csv(index=False)
