"""Simulator speed with adaptive budgets (auto:MS, idle_budget whole) against a fixed budget, on the
same Poisson trace.

Run: python benchmarks/bench_budget.py [--requests N ...]. Prints figures; asserts nothing. An
auto chunk is searched for (a bisection, each candidate priced as the replay charges it) and its
iterations are priced call by call (its chunks change every iteration, `sim.steady`); its
chunk-free iterations still run as steady stretches.
"""
import argparse
import gc
import time

import policies
from sim.costmodel import BUILTIN, cost_model, load_profile
from sim.metrics import score
from sim.replay import simulate
from sim.settings import setting_label
from traces.generators import poisson

SETTINGS = (
    {"policy": "chunked", "budget": 128, "batch_size": 8},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "idle_budget": "whole"},
    {"policy": "chunked", "budget": "auto:60", "batch_size": 8},
    {"policy": "chunked", "budget": "auto:60", "batch_size": 8, "idle_budget": "whole"},
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, nargs="+", default=[10000])
    p.add_argument("--rate", type=float, default=1.5, help="requests/s (the profile serves ~2/s)")
    a = p.parse_args()
    cost = cost_model(load_profile(BUILTIN))
    for n in a.requests:
        trace = poisson(n, a.rate, 64, 512, 32, 128, seed=0)
        base = None
        for setting in SETTINGS:
            gc.collect()
            gc.disable()  # as sweeps run (sim.sweep.evaluate)
            t0 = time.perf_counter()
            log = simulate(trace, policies.make(**setting, cost=cost), cost)
            t1 = time.perf_counter()
            m = score(log)
            gc.enable()
            base = base or (t1 - t0)
            calls = log.call_count
            print(f"{n:6d} requests {setting_label(setting):30s} {calls:8d} calls  simulate {t1 - t0:6.2f} s "
                  f"({(t1 - t0) / base:4.2f}x b128; {calls / (t1 - t0):9,.0f} calls/s)  gap p95 "
                  f"{m['decode_gap_p95_ms']:5.1f} ms  makespan {m['makespan_s']:,.0f} s")


if __name__ == "__main__":
    main()
