"""`pdsim confirm`: re-run settings on the real engine and print predicted against measured."""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.commands.common import (
    add_policy_args,
    add_trace_args,
    finite_float,
    positive_float,
    settings_from_args,
    trace_from_args,
    whole,
)
from sim.metrics.residuals import OFF
from sim.predict import REPLICAS

NEEDS_MLX = True
SPEED_SPREAD = 0.10  # runs' speeds further apart than this: the machine, not the model
MEMORY_SLOW = 0.75  # fresh memory slower than this against the calibration: a call that faults pages in runs long
# how a confirm's probes were read (`calibrate.confirm.score.probed_speed`'s `method`)
PROBE_METHODS = {"positional": "each timed against the calibration's probes in the same place",
                 "priced": "priced by the profile", "timed": "timed against the calibration's probes"}


def add_parser(sub) -> None:
    p = sub.add_parser("confirm", help="run settings on the real engine (MLX) and compare with the prediction",
                       description="Spot-check the simulator: run each setting on the real MLX engine "
                                   "(correctness gate, fresh process per run, alternating order, medians) "
                                   "and print predicted vs measured, metric by metric.")
    p.add_argument("--profile", required=True, help="profile from `pdsim calibrate` (names the model)")
    p.add_argument("--force", action="store_true", help="accept a profile measured on another device")
    p.add_argument("--engine", choices=["pdsim", "mlx-lm"], default="pdsim",
                   help="pdsim: pdsim's executor runs each setting's policy (default); mlx-lm: the installed "
                        "mlx_lm BatchGenerator itself runs mlx-lm settings (--policy mlx-lm)")
    p.add_argument("--any-mlx-lm", action="store_true",
                   help="run mlx-lm settings with an mlx-lm version the mlx-lm policy was not checked against")
    add_trace_args(p)
    add_policy_args(p, many=True)
    p.add_argument("--repeats", type=whole(1, 1000), default=4, help="fresh-process runs per setting (default 4)")
    p.add_argument("--warmup", type=whole(0, 100), default=1, help="warm-up passes inside each process (default 1)")
    p.add_argument("--warmup-with", choices=["trace", "short"], default="trace",
                   help="what a warm-up pass serves: trace (default) the trace itself, so the timed run finds "
                        "the process as serving this traffic leaves it, its memory grown; short: the first two "
                        "requests cut short, a process that has just started (its first growths fault memory in)")
    p.add_argument("--cooldown", type=finite_float(0.0, strict=False), default=0.0,
                   help="seconds to rest between runs (default 0)")
    p.add_argument("--stall-ms", type=positive_float, default=100.0)
    p.add_argument("--tolerance", type=positive_float,
                   help="exit 1 if any |relative error| exceeds this (e.g. 0.1)")
    p.add_argument("--slo", nargs="+", metavar="CONSTRAINT", default=None,
                   help="METRIC<=X (or >=) to check, predicted and measured, e.g. p99_ttft_ms<=2000 "
                        "decode_gap_p95_ms<=150: does a setting hold its SLOs at this rate, as `pdsim capacity` "
                        "predicted? (with --rescore: instead of the report's own)")
    p.add_argument("--rescore", metavar="REPORT",
                   help="measure nothing: predict the runs of an existing confirm report again with --profile "
                        "(e.g. after `pdsim calibrate --refit`) and write a new report")
    p.add_argument("--replicas", type=whole(0, 1000), default=REPLICAS,
                   help=f"predict each setting as the median over this many replays with the profile's call "
                        f"noise (default {REPLICAS}; 0: one replay at typical call times)")
    p.add_argument("-o", "--out", required=True, help="report JSON (never overwritten)")


def run(args: argparse.Namespace) -> int:
    from calibrate.confirm.protocol import confirm, rescore
    from sim.core.inputs import read_json_object
    from sim.cost.profile import load_profile
    prof = load_profile(args.profile)
    if args.rescore:
        report = rescore(read_json_object(args.rescore, "confirm report"), prof, Path(args.out), args.stall_ms,
                         args.rescore, args.replicas, args.slo)
    else:
        report = confirm(prof, trace_from_args(args), settings_from_args(args), Path(args.out), args.repeats,
                         args.warmup, args.cooldown, args.force, args.stall_ms, args.engine, args.any_mlx_lm,
                         args.replicas, args.warmup_with, tuple(args.slo or ()))
    return print_report(report, args.out, args.tolerance)


def print_report(report: dict, out: str, tolerance: float | None) -> int:
    from sim.core.table import fmt, table
    from sim.metrics.decisions import summary as paths_summary
    print(f"gate: chunked logits match one-shot (rtol=atol=1e-3): "
          f"{all(g['ok'] for g in report['gate']['logits'])}; identical greedy tokens across settings: "
          f"{report['gate']['greedy_tokens_identical']} (timed runs: {report['gate']['timed_runs_identical_tokens']})")
    if "policy_calls_identical" in report["gate"]:
        print(f"engine: mlx-lm {report['engine'].get('mlx_lm')} BatchGenerator; its calls are the mlx-lm policy's, "
              f"call by call, in every run: {report['gate']['policy_calls_identical']} ({report['engine']['timing']})")
    if "prediction" in report:  # reports before call noise predicted with one replay
        print(f"prediction: {report['prediction']['how']}")
    passes = report["protocol"].get("warmup", 1)
    warm = {"trace": "the trace itself", "short": "its first two requests cut short"}[
        report["protocol"].get("warmup_with", "short")]  # reports before --warmup-with warmed up short
    print(f"warm-up: each process served {warm} untimed before its timed run ({passes}x), and so does the "
          f"prediction" if passes else "warm-up: none (--warmup 0)")
    worst = 0.0
    for res in report["results"]:
        rows = []
        speed = (res.get("machine_speed") or {}).get("median")  # reports before speed probes have none
        drift = res.get("at_calibration_speed", {}).get("rel_error", {})
        for k, m in res["measured"].items():
            err = res["rel_error"][k]
            worst = max(worst, abs(err)) if k != "resume_gap_max_ms" else worst
            lo, hi = res.get("predicted_range", {}).get(k, (None, None))
            rows.append({"metric": k, "predicted": res["predicted"][k],
                         "prange": f"{fmt(lo)}..{fmt(hi)}" if lo is not None else "-", "measured": m["median"],
                         "range": f"{fmt(m['min'])}..{fmt(m['max'])}", "error": f"{err:+.1%}",
                         "calib": _signed(drift.get(k))})
        cols = ["metric", "predicted", "prange", "measured", "range", "error"] + (["calib"] if speed else [])
        print(f"\n{res['label']}  ({report['protocol']['repeats']} runs)")
        print(table(rows, cols, ["metric", "predicted", "replays min..max", "measured (median)", "min..max",
                                 "rel. error", "at calib. speed"][:len(cols)]))
        for v in res.get("slo", ()):
            print(f"SLO {v['slo']}: predicted {fmt(v['predicted'])} ({_held(v['holds_predicted'])}), measured "
                  f"{fmt(v['measured'])} ({_held(v['holds_measured'])})"
                  + ("" if v["as_predicted"] else ": not as predicted"))
        if speed:
            runs = [p for p in res["machine_speed"]["runs"] if p.get("prefill")]
            method = runs[0].get("method", "priced") if runs else "priced"
            beside = "priced" if method == "positional" else "timed"  # the other reading, kept in the report
            other = [p for p in runs if p.get(beside) and p.get("method") != beside]  # timed beside priced
            how = PROBE_METHODS.get(method, PROBE_METHODS["priced"])
            print(f"machine speed against the calibration, prefill/decode (speed probes before and after each run, "
                  f"{how}): " + " ".join(f"r{p['repeat']} {p['prefill']:.2f}/{p['decode']:.2f}" for p in runs)
                  + f"; probes' median {speed['prefill']:.2f}/{speed['decode']:.2f}"
                  + (f", predicted at {at['prefill']:.2f}/{at['decode']:.2f} (partway: the profile's speed rules)"
                     if (at := res["machine_speed"].get("predicted_at")) else "")
                  + (f"; a single decode's growth faults at {at['page']:.2f}x the calibration's dear page "
                     f"(the probes' dearest reading: speed_probe.page_price)" if at and "page" in at else "")
                  + (f"; {PROBE_METHODS[beside]}: " + " ".join(
                      f"r{p['repeat']} {p[beside]['prefill']:.2f}/{p[beside]['decode']:.2f}" for p in other)
                     if other else ""))
        memory = [p for p in (res.get("machine_speed") or {}).get("runs", ()) if p.get("memory")]
        if memory:  # probes that timed an allocation
            slow = res["machine_speed"]["memory"] < MEMORY_SLOW
            print("fresh memory's speed against the calibration (an allocation timed by each probe): "
                  + " ".join(f"r{p['repeat']} {p['memory']:.2f}" for p in memory)
                  + ("; slow: a call that faults fresh pages in (the per-call table's faulted column) runs "
                     "longer than its price" if slow else ""))
        speeds = {r["repeat"]: r["pred_over_meas"] for r in res.get("run_speed", ()) if r["pred_over_meas"]}
        if speeds:
            spread = max(speeds.values()) / min(speeds.values()) - 1
            print("runs' calls, predicted/measured (median over each run's calls): "
                  + " ".join(f"r{rep} {v:.2f}" for rep, v in speeds.items())
                  + (f"; {spread:.0%} apart: the machine changed speed between runs, and every measured figure "
                     "moved with it" if spread > SPEED_SPREAD else ""))
        for r in res.get("run_speed", ()):
            for st in r.get("off_stretches") or ():
                kinds = ", ".join(f"{k} {v:.2f}" for k, v in st["by_kind"].items())
                alike = len(st["by_kind"]) > 1 and all(abs(v - 1) >= OFF / 2 and (v < 1) == (st["ratio"] < 1)
                                                       for v in st["by_kind"].values())
                print(f"  r{r['repeat']}: its calls at {st['start_s']:.1f}-{st['end_s']:.1f} s ({st['calls']}) ran at "
                      f"{st['ratio']:.2f}x the run's pace ({kinds})"
                      + ("; every kind alike: the host, not a price" if alike else ""))
        if res.get("paths"):  # reports that follow the replays' paths
            print(paths_summary(res["paths"]))
        if res.get("classes"):  # a trace with priority classes: TTFT by class
            print(table([{"class": c, "metric": k, "predicted": v["predicted"][k], "measured": m["median"],
                          "range": f"{fmt(m['min'])}..{fmt(m['max'])}", "error": _signed(v["rel_error"][k])}
                         for c, v in res["classes"].items() for k, m in v["measured"].items()],
                        ["class", "metric", "predicted", "measured", "range", "error"],
                        ["class", "metric", "predicted", "measured (median)", "min..max", "rel. error"]))
        if res.get("calls_by_kind"):  # reports written before the per-call table have none
            faults = all("faulted" in c for c in res["calls_by_kind"])  # runs that counted page faults
            rows = all("fresh_rows" in c for c in res["calls_by_kind"])  # and the rows of it
            print(table([dict(c, range=f"{fmt(c['ratio_p10'])}..{fmt(c['ratio_p90'])}") for c in res["calls_by_kind"]],
                        ["kind", "calls", "ratio_median", "range", "abs_error_median"]
                        + (["faulted", "faulted_ratio_median"] if faults else [])
                        + (["fresh_rows", "faulted_rows", "fresh_rows_error"] if rows else []),
                        ["call kind", "calls", "pred/meas (median)", "p10..p90", "median |err|"]
                        + (["faulted >1 MiB", "their pred/meas"] if faults else [])
                        + (["fresh rows (sim.engine.heap)", "rows faulted", "sum |diff|"] if rows else [])))
    print(f"\nwrote {out}" + (f" ({report['wall_s']:.0f} s)" if "rescored_from" not in report else
                              f" (rescored {report['rescored_from']} with {report['profile']['path']})"))
    if tolerance and worst > tolerance:
        print(f"largest |relative error| {worst:.1%} exceeds --tolerance {tolerance:.1%}")
        return 1
    return 0


def _held(ok: bool) -> str:
    return "holds" if ok else "broken"


def _signed(err: float | None) -> str:
    """A relative error as a signed percentage; `-` where it is undefined (measured 0, predicted not)."""
    return "-" if err is None else f"{err:+.1%}"
