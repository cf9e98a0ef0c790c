"""`pdsim metrics`: every metric a run reports, with its unit, definition and better direction."""
from __future__ import annotations

import argparse

from sim.metrics import registry


def add_parser(sub) -> None:
    sub.add_parser("metrics", help="list the metrics (names usable in --slo, --objective, --latency)",
                   description="Every metric pdsim reports (sweep columns, simulate and confirm rows): name, "
                               "unit, which direction is better, whose definition, and aliases.")


def run(args: argparse.Namespace) -> int:
    for m in registry.METRICS.values():
        better = f"{m.better} is better" if m.better else "descriptive"
        extra = ([f"alias {', '.join(m.aliases)}"] if m.aliases else []) + (["needs a --slo target"] if m.needs_slo else [])
        print(f"{m.name}  [{m.unit}; {better}; {m.source}{'; ' + '; '.join(extra) if extra else ''}]")
        print(f"    {m.definition}")
    return 0
