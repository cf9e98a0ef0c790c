"""`pdsim traces gen|info|convert`: make, describe and convert arrival traces."""
from __future__ import annotations

import argparse

from sim.commands.common import add_trace_args, trace_from_args
from traces.generators import GENERATORS


def add_parser(sub) -> None:
    p = sub.add_parser("traces", help="generate, describe and convert traces")
    tsub = p.add_subparsers(dest="traces_cmd", required=True, metavar="{gen}")
    g = tsub.add_parser("gen", help="write a generated trace as JSONL")
    g.add_argument("kind", choices=list(GENERATORS))
    add_trace_args(g)
    g.add_argument("-o", "--out", required=True, help="output JSONL file")
    g.add_argument("--overwrite", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.traces_cmd == "gen":
        args.trace = args.kind
        trace = trace_from_args(args)
        trace.save_jsonl(args.out, overwrite=args.overwrite)
        print(f"wrote {args.out}: {len(trace)} requests, sha256 {trace.sha256()}")
    return 0
