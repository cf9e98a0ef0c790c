"""`pdsim sweep`: replay traces under a grid of settings, pick the best one under SLO constraints."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

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
from sim.core.outdir import OutputFolder
from sim.core.table import fmt, table
from sim.metrics import registry
from sim.sweep.pick import Pick, parse_objective
from sim.sweep.results import (
    RESULT_NAMES,
    SweepPlan,
    SweepResult,
    log_points,
    results_doc,
    run_plan,
    save_logs,
    write_results,
)
from sim.sweep.run import SweepError

GRID_OPTIONS = ("--trace", "--policy", "--budget", "--batch-size", "--decode", "--order", "--queue", "--aging-s",
                "--prefill-step", "--prompt-concurrency", "--decode-concurrency", "--idle-budget", "--kv-limit")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="replay traces under a grid of settings in parallel; pick the best under SLOs",
        description="Simulate every combination of the given traces, arrival-rate scales, policies, budgets, "
                    "batch sizes, decode modes, orders and queue orders (in local processes, or on a Dask cluster), write "
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
    g.add_argument("--objective", default=f"max:{registry.DEFAULT_OBJECTIVE}", type=parse_objective,
                   metavar="[max|min:]METRIC",
                   help="what the pick optimizes among settings meeting every constraint (default "
                        f"max:{registry.DEFAULT_OBJECTIVE}; a bare METRIC goes the way that is better for it; "
                        "`pdsim metrics` lists them)")
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


def run(args: argparse.Namespace) -> int:
    for opt in GRID_OPTIONS + ("--rate-scale",):
        if not getattr(args, opt[2:].replace("-", "_")):
            raise SweepError(f"empty grid: {opt} was given no values")
    SweepPlan({}, [], {}, slo=args.slo, objective=args.objective, latency=args.latency)  # names first: a typo
    # is refused before any trace is read
    settings = settings_from_args(args)
    if not args.out:
        return _run(args, settings, None)
    with OutputFolder(args.out, RESULT_NAMES, args.overwrite, "sweep output folder") as folder:  # before any work
        return _run(args, settings, folder)


def _run(args: argparse.Namespace, settings: list[dict], folder: OutputFolder | None) -> int:
    traces = traces_from_args(args)
    prof, _ = cost_from_args(args)
    check_traces_fit(prof, traces)
    check_kv_limits(prof, traces, settings)
    plan = SweepPlan(traces, settings, prof, args.rate_scale, args.slo, args.objective, args.latency,
                     args.stall_ms, args.top)
    grid_options = {"policy": args.policy, "budget": args.budget, "batch_size": args.batch_size,
                    "decode": args.decode, "order": args.order, "queue": args.queue, "aging_s": args.aging_s,
                    "prefill_step": args.prefill_step,
                    "prompt_concurrency": args.prompt_concurrency, "decode_concurrency": args.decode_concurrency,
                    "idle_budget": args.idle_budget, "kv_limit": args.kv_limit,
                    "setting": getattr(args, "setting", None)}
    execute(plan, folder, grid_options, args.logs, args.overwrite, args.workers, args.scheduler,
            not args.no_progress, args.connect_timeout)
    return 0


def execute(plan: SweepPlan, out: OutputFolder | Path | None, grid_options: dict, logs: int = 0,
            overwrite: bool = False, workers: int | None = None, scheduler: str | None = None,
            progress: bool = True, connect_timeout: float = 10.0) -> SweepResult:
    """Run the plan, print the picks, keep the best settings' logs, write the results: `pdsim sweep`
    after its arguments are read (and `pdsim tune`'s sweep). `out`: the output folder, open
    (`sim.core.outdir.OutputFolder`, locked before the sweep's first second of work) or a path."""
    if isinstance(out, Path):
        with OutputFolder(out, RESULT_NAMES, overwrite, "sweep output folder") as folder:
            return execute(plan, folder, grid_options, logs, overwrite, workers, scheduler, progress, connect_timeout)
    n = len(plan.points())
    where = f"Dask at {scheduler}" if scheduler else f"{min(workers or (os.cpu_count() or 1), n)} local process(es)"
    print(f"sweep: {len(plan.settings)} setting(s) x {len(plan.traces)} trace(s) x {len(plan.rate_scales)} "
          f"rate scale(s) = {n} runs on {where}")
    inputs = plan.inputs()
    print(f"  profile {plan.profile['model']['name']} on {plan.profile['device'].get('name', '?')}"
          + (f" ({plan.profile['device']['id']})" if plan.profile['device'].get('id') else ""))
    for name, tr in plan.traces.items():
        print(f"  trace {name}: {len(tr)} requests, sha256 {inputs.sha256[name][:12]}")
    result = run_plan(plan, workers, scheduler, progress, connect_timeout, inputs)
    print(f"swept {len(result.points)} runs in {result.wall_s:.1f} s")
    for pk in result.picks:
        print_pick(pk, plan, len(plan.traces) * len(plan.rate_scales) > 1)
    if out is None:
        print("\nresults not saved (pass -o OUTDIR to write results.csv and results.json)")
        return result
    chosen = log_points(result, logs) if logs else []
    if chosen:
        print(f"keeping the event logs of {len(chosen)} setting(s) (re-running them)")
    kept = save_logs(result, out.out, chosen, workers, scheduler, progress, connect_timeout, into=out.staging)
    write_results(out.staging, results_doc(result, grid_options, where, kept), result.df)
    out.commit(last="results.json")
    print(f"\nwrote {out.out / 'results.csv'}, {out.out / 'results.json'}" + (f" and {len(kept)} log(s)" if kept else ""))
    return result


def shown_metrics(plan: SweepPlan) -> list[str]:
    cols = [plan.objective.metric, plan.latency] + [c.metric for c in plan.constraints]
    return list(dict.fromkeys(cols + list(registry.SWEEP_SHOWN)))


def print_pick(pk: Pick, plan: SweepPlan, name_group: bool) -> None:
    cols = shown_metrics(plan)
    group = ", ".join(f"{k} {v}" for k, v in pk.group.items())
    subject = f" subject to {', '.join(map(str, plan.constraints))}" if plan.constraints else ""
    print(f"\n== {group}: " if name_group else "\n", end="")
    print(f"{plan.objective}{subject}: {pk.feasible} of {pk.total} settings qualify")
    if pk.best is None:
        print("no setting meets every constraint; loosen --slo, or widen the grid")
    else:
        print(f"pick: {pk.best['label']}  " + "  ".join(f"{c} {_fmt(pk.best[c])}" for c in cols))
        if len(pk.runners_up):
            print("runners-up:")
            print(table(pk.runners_up.to_dict("records"), ["label"] + cols))
    print(f"Pareto front ({plan.throughput} vs {plan.latency}):")
    front = pk.front.to_dict("records")
    print(table(front, ["label", plan.latency, plan.throughput]) if front else "  (no finite points)")


def _fmt(v) -> str:
    return fmt(float(v)) if isinstance(v, (int, float)) else str(v)
