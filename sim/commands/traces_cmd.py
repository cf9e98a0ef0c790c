"""`pdsim traces gen|info|convert`: make, describe and convert arrival traces."""
from __future__ import annotations

import argparse
import math

from sim.commands.common import (
    add_shaping_args,
    add_trace_args,
    positive_float,
    positive_fraction,
    seed_int,
    trace_from_args,
    traces_from_args,
)
from sim.core.files import check_output, dumps
from sim.core.table import table
from traces.classes import classes
from traces.formats import FORMATS, format_name
from traces.generators import BURSTINESS_HELP, GENERATORS
from traces.stats import describe
from traces.trace import Trace, TraceError


def add_parser(sub) -> None:
    p = sub.add_parser("traces", help="generate, describe and convert traces")
    tsub = p.add_subparsers(dest="traces_cmd", required=True, metavar="{gen,info,convert}")
    g = tsub.add_parser("gen", help="write a generated trace as JSONL")
    g.add_argument("kind", choices=list(GENERATORS))
    add_trace_args(g)
    g.add_argument("-o", "--out", required=True, help="output JSONL file")
    g.add_argument("--overwrite", action="store_true")

    i = tsub.add_parser("info", help="count, duration, rate, burstiness and length percentiles of a trace",
                        description="Describe a trace file (any supported format) or a generator, after any "
                                    "shaping. CV^2 is the squared coefficient of variation of the inter-arrival "
                                    "gaps (1 = Poisson, above 1 burstier); burstiness is 1/CV^2, the gamma shape "
                                    "with that variation, in the generators' (and vLLM's) convention.")
    add_file_args(i)
    i.add_argument("--json", action="store_true", help="print the figures and the metadata as JSON")

    c = tsub.add_parser("convert", help="read a trace in any supported format, shape it, write pdsim JSONL",
                        description="Read a public trace, shape it, and write pdsim's JSONL (with the source "
                                    "and every shaping step in its metadata).")
    add_file_args(c)
    c.add_argument("-o", "--out", required=True, help="output JSONL file")
    c.add_argument("--overwrite", action="store_true")


def add_file_args(p: argparse.ArgumentParser) -> None:
    """The trace file, how to read it, and how to shape it (shared by info and convert)."""
    p.add_argument("file", metavar="FILE", help="a trace file in any supported format, or a generator name")
    r = p.add_argument_group("reading")
    r.add_argument("--format", type=_format, metavar="NAME",
                   help="the file's format, if not detected from its header (aliases: azure2023, azure2024, "
                        "splitwise, jsonl): "
                        + "; ".join(f"{n}: {f.about}" for n, f in FORMATS.items()) + "; pdsim: pdsim's own JSONL")
    r.add_argument("--arrivals", choices=["poisson", "gamma"],
                   help="length-only CSVs: the arrival process to draw (default poisson)")
    r.add_argument("--rate", type=positive_float, help="length-only CSVs: requests per second (default 1)")
    r.add_argument("--burstiness", type=positive_fraction, help="length-only CSVs, gamma arrivals: " + BURSTINESS_HELP)
    r.add_argument("--seed", type=seed_int, help="seed for drawn arrivals and for --sample (default 0)")
    r.add_argument("--burstgpt-model", metavar="NAME", help="BurstGPT: keep only this model (e.g. ChatGPT, GPT-4)")
    r.add_argument("--burstgpt-log", metavar="TYPE", help="BurstGPT: keep only this log type (conversation, api)")
    r.add_argument("--class-slo", nargs="+", default=[], metavar="CLASS:ttft=MS",
                   help="a TTFT target for every request of a class (the file's `class` column), e.g. tight:ttft=500")
    add_shaping_args(p)


def _format(text: str) -> str:
    try:
        return format_name(text)
    except TraceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def file_trace_from_args(args: argparse.Namespace) -> Trace:
    """The trace FILE names, read with the reading options and shaped with the shaping options."""
    (trace,) = traces_from_args(args, [args.file]).values()
    return trace


def run(args: argparse.Namespace) -> int:
    if getattr(args, "out", None):  # before reading anything: an existing file, the input itself, a folder
        check_output(args.out, args.overwrite, [getattr(args, "file", None)], what="trace")
    if args.traces_cmd == "gen":
        args.trace = args.kind
        trace = trace_from_args(args)
        trace.save_jsonl(args.out, overwrite=args.overwrite)
        print(f"wrote {args.out}: {len(trace)} requests, sha256 {trace.sha256()}")
    elif args.traces_cmd == "info":
        trace = file_trace_from_args(args)
        stats = describe(trace)
        if args.json:
            print(dumps({"meta": trace.meta, "sha256": trace.sha256(), "stats": stats.to_dict()}, indent=1))
        else:
            print(info_text(trace, stats))
    elif args.traces_cmd == "convert":
        trace = file_trace_from_args(args)
        trace.save_jsonl(args.out, overwrite=args.overwrite)
        print(f"wrote {args.out}: {len(trace)} requests from {trace.meta.get('source')} "
              f"({trace.meta.get('format', 'generated')}), sha256 {trace.sha256()}")
    return 0


def info_text(trace: Trace, stats) -> str:
    m = trace.meta
    lines = [f"trace {m.get('source')} ({m.get('format', 'generated')}), sha256 {trace.sha256()[:12]}"]
    for key in ("arrivals", "model", "log_type", "dropped", "clamped_zero") if "format" in m else ():
        if m.get(key) is not None:
            lines.append(f"  {key}: {m[key]}")
    if not m.get("read_to_end", True):
        lines.append(f"  read the first {m.get('rows_read')} rows only (the shaping needed no more)")
    for step in m.get("shaping", []):
        lines.append("  shaping: " + ", ".join(f"{k}={v}" for k, v in step.items()))
    lines += [f"requests     {stats.count:,}",
              f"duration     {stats.duration_s:,.3f} s",
              f"mean rate    {_num(stats.mean_rate, ',.4g')} requests/s",
              f"CV^2 of gaps {_num(stats.cv2, '.4g')}  (1 = Poisson, above 1 burstier)",
              f"burstiness   {_num(stats.burstiness, '.4g')}  (1/CV^2: the gamma shape, vLLM's convention; "
              "below 1 burstier)",
              f"gaps         p50 {stats.gap_p50_s:.4g} s, p99 {stats.gap_p99_s:.4g} s, max {stats.gap_max_s:.4g} s",
              ""]
    for cls in classes(trace):
        reqs = [r for r in trace.requests if r.cls == cls]
        targets = sorted({r.ttft_slo_ms for r in reqs if r.ttft_slo_ms is not None})
        lines.append(f"class {cls}: {len(reqs):,} requests, prompts mean {sum(r.prompt_len for r in reqs) / len(reqs):,.0f}"
                     f", TTFT target {', '.join(f'{t:g}' for t in targets) + ' ms' if targets else 'none'}")
    if classes(trace):
        lines.append("")
    rows = [{"tokens": name, **vars(getattr(stats, name))} for name in ("prompt", "output")]
    lines.append(table(rows, ["tokens", "min", "mean", "p50", "p90", "p99", "max", "total"]))
    return "\n".join(lines)


def _num(v: float, spec: str) -> str:
    """A figure, or `-` where it is undefined (one request, or all arriving at once)."""
    return "-" if math.isnan(v) else format(v, spec)
