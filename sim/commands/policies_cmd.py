"""`pdsim policies`: the policies and the options they take."""
from __future__ import annotations

import argparse

import policies


def add_parser(sub) -> None:
    sub.add_parser("policies", help="list the scheduling policies and their options")


def run(args: argparse.Namespace) -> int:
    print("policies:")
    for name, info in policies.POLICIES.items():
        print(f"  {name:8s} {info.doc} (options: {', '.join(info.uses)})")
    print("options (fifo, eager, chunked read theirs; mlx-lm takes only its own three, mlx_lm.server's flags):")
    for name, doc in policies.OPTION_HELP.items():
        print(f"  --{name.replace('_', '-'):20s} {doc}")
    return 0
