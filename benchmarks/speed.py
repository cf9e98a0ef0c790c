"""The simulator's wall time for a few settings on one Poisson trace, the first setting the base.

Shared by the speed benchmarks (`bench_mlxlm.py`, `bench_budget.py`): each names its settings
and calls `main`. Prints figures; asserts nothing. GC off while a setting runs, as sweeps run
(`sim.sweep.run.evaluate`).
"""
from __future__ import annotations

import argparse
import gc
import time

import policies
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.scoring import score
from sim.replay import simulate
from policies.settings import setting_label
from traces.generators import poisson


def main(settings: tuple[dict, ...]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, nargs="+", default=[10000])
    p.add_argument("--rate", type=float, default=1.5, help="requests/s (the profile serves ~2/s)")
    a = p.parse_args()
    cost = cost_model(load_profile(BUILTIN))
    base_label = setting_label(settings[0])
    for n in a.requests:
        trace = poisson(n, a.rate, 64, 512, 32, 128, seed=0)
        base = None
        for setting in settings:
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            log = simulate(trace, policies.make(**setting, cost=cost), cost)
            t1 = time.perf_counter()
            m = score(log)
            t2 = time.perf_counter()
            gc.enable()
            base = base or (t1 - t0)
            calls = log.call_count
            print(f"{n:6d} requests {setting_label(setting):30s} {calls:8d} calls  simulate {t1 - t0:6.2f} s "
                  f"({(t1 - t0) / base:4.2f}x {base_label}; {calls / (t1 - t0):9,.0f} calls/s)  metrics {t2 - t1:5.2f} s  "
                  f"gap p95 {m['decode_gap_p95_ms']:6.1f} ms  makespan {m['makespan_s']:,.0f} s")
