"""Sweep speed: wall time of a budgets x policies grid over a 19,366-request trace, the size of Azure's
2023 conversation trace.

Run: python benchmarks/bench_sweep.py [--trace FILE_OR_GENERATOR] [--workers N] [--budgets ...]
By default the trace is Poisson at the Azure conversation trace's rate (19,366 requests in 3,502 s)
with uniform lengths of the same means (prompt 1,155, output 211 tokens); give the CSV itself with
--trace ../shared/traces/azure-2023/AzureLLMInferenceTrace_conv.csv. Prints the wall time against
the 60 s target and each run's share; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import time

from sim.cost.profile import BUILTIN, load_profile
from policies.settings import grid_settings, setting_label
from sim.sweep.run import Inputs, grid, run_points
from traces.load import resolve

TARGET_S = 60.0
AZURE_CONV = {"num_requests": 19366, "rate": 19366 / 3501.7, "min_in": 2, "max_in": 2307, "min_out": 7,
              "max_out": 415}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="poisson", help="a trace file, or a generator (default: poisson shaped "
                                                      "like the Azure conversation trace)")
    p.add_argument("--requests", type=int, default=AZURE_CONV["num_requests"], help="generator: requests")
    p.add_argument("--rate", type=float, default=AZURE_CONV["rate"], help="generator: requests/s")
    p.add_argument("--policies", nargs="+", default=["fifo", "eager", "chunked"])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--profile", default=str(BUILTIN))
    a = p.parse_args()

    t0 = time.perf_counter()
    opts = dict(AZURE_CONV, num_requests=a.requests, rate=a.rate) if a.trace in ("poisson", "gamma") else {}
    trace = resolve(a.trace, **opts)
    # the grid `pdsim sweep --policy ... --budget ...` runs (fifo and eager take no budget)
    settings = grid_settings(a.policies, a.budgets, [a.batch_size])
    inputs = Inputs({"bench": trace}, load_profile(a.profile))
    points = grid(settings, ["bench"])
    t_load = time.perf_counter() - t0
    print(f"trace {trace.meta.get('source')}: {len(trace)} requests, "
          f"{sum(r.prompt_len for r in trace.requests):,} prompt and {sum(r.output_len for r in trace.requests):,} "
          f"output tokens (loaded in {t_load:.1f} s)")
    print(f"grid: {len(a.policies)} policies x {len(a.budgets)} budgets = {len(points)} runs (fifo and eager "
          f"prefill whole prompts, so budgets do not multiply them) on {a.workers} worker process(es), "
          f"{os.cpu_count()} cores")

    t1 = time.perf_counter()
    results = run_points(points, inputs, workers=a.workers, progress=True)
    wall = time.perf_counter() - t1
    calls = sum(m["engine_calls"] for m, _ in results)
    for pt, (m, _) in zip(points, results):
        print(f"  {setting_label(pt.setting):18s} {m['engine_calls']:>10,} calls  "
              f"output_throughput {m['output_throughput']:8.1f}  decode_gap_p95_ms {m['decode_gap_p95_ms']:8.1f}")
    print(f"sweep wall time {wall:.1f} s for {len(points)} runs, {calls:,} engine calls "
          f"({calls / wall:,.0f} calls/s overall); target <= {TARGET_S:.0f} s: "
          f"{'met' if wall <= TARGET_S else 'MISSED'}")


if __name__ == "__main__":
    main()
