"""`pdsim simulate`: replay one trace under one setting and print its metrics."""
from __future__ import annotations

import argparse

import policies
from sim.commands.common import (add_policy_args, add_profile_args, add_slo_args, add_trace_args, cost_from_args,
                                 settings_from_args, slo_from_args, trace_from_args)
from sim.files import atomic_write_json
from sim.metric_registry import METRICS, SUMMARY
from sim.metrics import request_rows, score
from sim.replay import simulate
from sim.settings import setting_label
from sim.table import table


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="replay a trace under one policy setting with a cost profile",
                       description="Replay a trace in the discrete-event simulator and print its metrics.")
    add_trace_args(p)
    add_policy_args(p)
    add_profile_args(p)
    add_slo_args(p)
    p.add_argument("--json-out", help="write metrics, per-request rows and the event log here (JSON)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --json-out file")


def run(args: argparse.Namespace) -> int:
    trace = trace_from_args(args)
    (setting,) = settings_from_args(args)
    prof, cost = cost_from_args(args)
    log = simulate(trace, policies.make(**setting), cost)
    slo = slo_from_args(args)
    m = score(log, slo, args.stall_ms)
    print(f"trace {trace.meta.get('source')} ({len(trace)} requests, sha256 {trace.sha256()[:12]}), "
          f"{setting_label(setting)}, profile {prof['model']['name']} on {prof['device'].get('name', '?')}")
    shown = [k for k in SUMMARY if slo or not METRICS[k].needs_slo]
    print(table([{"metric": k, "value": m[k]} for k in shown], ["metric", "value"]))
    rows = request_rows(log)
    if len(rows) <= 12:
        ms = lambda v: None if v is None else v * 1e3
        view = [dict(r, ttft=ms(r.get("ttft")), e2el=ms(r.get("e2el")), gap_max=ms(r.get("gap_max")),
                     gap_p95=ms(r.get("gap_p95"))) for r in rows]
        print()
        print(table(view, ["id", "arrival", "prompt_len", "output_len", "ttft", "gap_p95", "gap_max", "e2el"],
                    ["request", "arrival s", "prompt", "output", "ttft ms", "gap p95 ms", "gap max ms", "e2e ms"]))
    if args.json_out:
        atomic_write_json(args.json_out, {"setting": setting, "trace": {"meta": trace.meta, "sha256": trace.sha256()},
                                          "profile": prof.get("_path"), "metrics": m, "requests": rows,
                                          "log": log.to_dict()}, overwrite=args.overwrite)
        print(f"wrote {args.json_out}")
    return 0
