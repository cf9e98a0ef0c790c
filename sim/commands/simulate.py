"""`pdsim simulate`: replay one trace under one setting and print its metrics.

The run is scored as it goes (`sim.metrics.scored_log`), so a trace of any length replays in memory
that does not grow with its engine calls; the event log is kept only when asked (`--log-out`,
a columnar file), never inside the JSON of `--json-out`.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from tqdm import tqdm

import policies
from policies.settings import setting_label
from sim.commands.common import (
    add_policy_args,
    add_profile_args,
    add_slo_args,
    add_trace_args,
    check_kv_limits,
    check_traces_fit,
    cost_from_args,
    settings_from_args,
    slo_from_args,
    trace_from_args,
)
from sim.core.files import atomic_write_json, check_output
from sim.core.table import table
from sim.metrics.registry import METRICS, SUMMARY
from sim.metrics.scored_log import simulate_scored
from sim.metrics.scoring import CLASS_SHOWN, class_metrics
from sim.metrics.tally import ESTIMATE_NOTE, RequestTable

SHOWN_REQUESTS = 12  # a trace this short gets its per-request table printed


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="replay a trace under one policy setting with a cost profile",
                       description="Replay a trace in the discrete-event simulator and print its metrics.")
    add_trace_args(p)
    add_policy_args(p)
    add_profile_args(p)
    add_slo_args(p)
    p.add_argument("--json-out", help="write the setting, trace, profile and metrics here (JSON)")
    p.add_argument("--log-out", metavar="FILE.npz",
                   help="keep the event log: every call and token, and per-request figures, in a columnar file "
                        "(numpy .npz; `sim.metrics.logfile.read_log` or `pdsim report --simulate` read it)")
    p.add_argument("--overwrite", action="store_true", help="replace existing --json-out / --log-out files")


def run(args: argparse.Namespace) -> int:
    inputs = [args.trace, args.profile]
    for out in (args.json_out, args.log_out):
        if out:
            check_output(out, args.overwrite, inputs)
    if args.json_out and args.log_out and Path(args.json_out).resolve() == Path(args.log_out).resolve():
        raise_same(args.json_out)
    trace = trace_from_args(args)
    (setting,) = settings_from_args(args)
    prof, cost = cost_from_args(args)
    check_traces_fit(prof, {"trace": trace})
    check_kv_limits(prof, {"trace": trace}, [setting])
    slo = slo_from_args(args)
    sha = trace.sha256()
    writer = None
    if args.log_out:
        from sim.metrics.logfile import LogWriter
        writer = LogWriter(args.log_out, RequestTable.of(trace.requests), args.overwrite)
    has_classes = any(r.cls is not None for r in trace.requests)
    if setting.get("queue") == "priority" and not any(r.ttft_slo_ms is not None for r in trace.requests):
        print("note: queue priority with no TTFT target in the trace (--class-slo CLASS:ttft=MS): "
              "no request has a deadline, so the order is arrival order")
    # a long trace replays for minutes: a bar over requests served, shown only after 2 s
    bar = tqdm(total=len(trace), desc="simulating", unit="req", delay=2, smoothing=0, mininterval=1)
    try:
        tally = simulate_scored(trace, policies.make(**setting, cost=cost), cost, slo, args.stall_ms,
                                keep_rows=len(trace) <= SHOWN_REQUESTS or writer is not None or has_classes,
                                writer=writer, on_done=bar.update)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        bar.close()
    m, estimated = tally.result(), tally.estimated()
    print(f"trace {trace.meta.get('source')} ({len(trace)} requests, sha256 {sha[:12]}), "
          f"{setting_label(setting)}, profile {prof['model']['name']} on {prof['device'].get('name', '?')}")
    shown = [k for k in SUMMARY if slo or not METRICS[k].needs_slo]
    print(table([{"metric": k, "value": m[k]} for k in shown], ["metric", "value"]))
    if estimated:
        print(f"note: {ESTIMATE_NOTE} ({', '.join(sorted(k for k in estimated if k in shown)) or 'none shown'})")
    if len(trace) <= SHOWN_REQUESTS:
        print()
        print(table(request_view(trace, tally), ["id", "arrival", "prompt_len", "output_len", "ttft", "gap_p95",
                                                 "gap_max", "e2el"],
                    ["request", "arrival s", "prompt", "output", "ttft ms", "gap p95 ms", "gap max ms", "e2e ms"]))
    by_class = class_metrics(trace.requests, tally.rows.ttft, tally.rows.generated) if has_classes else None
    if by_class:
        print()
        print(class_table(by_class))
    doc = {"setting": setting, "trace": {"meta": trace.meta, "sha256": sha}, "profile": prof.get("_path"),
           "metrics": m, "estimated": estimated, "log_file": str(args.log_out) if args.log_out else None,
           **({"classes": by_class} if by_class else {})}
    if writer is not None:
        writer.close(doc, tally.rows)
        print(f"wrote {args.log_out} (event log: {writer.calls:,} calls)")
    if args.json_out:
        atomic_write_json(args.json_out, doc, overwrite=args.overwrite)
        print(f"wrote {args.json_out}")
    return 0


def class_table(by_class: dict) -> str:
    """The per-class TTFT figures (`sim.metrics.scoring.class_metrics`), one row per class."""
    undefined = lambda v: isinstance(v, float) and math.isnan(v)
    return table([{"class": c, **{k: None if undefined(v[k]) else v[k] for k in CLASS_SHOWN}}
                  for c, v in by_class.items()], ["class", *CLASS_SHOWN])


def raise_same(path: str) -> None:
    from sim.core.files import OutputError
    raise OutputError(f"--json-out and --log-out both name {path}; give them different files")


def request_view(trace, tally) -> list[dict]:
    """The per-request table of a short trace, in milliseconds."""
    rows, out = tally.rows, []
    ms = lambda v: None if math.isnan(v) else v * 1e3
    for i, r in enumerate(trace.requests):
        out.append({"id": r.id, "arrival": r.arrival, "prompt_len": r.prompt_len, "output_len": r.output_len,
                    "ttft": ms(rows.ttft[i]), "gap_p95": ms(rows.gap_p95[i]), "gap_max": ms(rows.gap_max[i]),
                    "e2el": ms(rows.e2el[i])})
    return out
