"""Simulator speed: engine calls per wall second, and wall time for a 10,000-request Poisson trace.

Run: python benchmarks/bench_sim.py [--requests N ...]. Prints figures; asserts nothing. The calls/s
should not fall as traces grow (per-call cost independent of trace length).
"""
import argparse
import time

import policies
from sim.costmodel import BUILTIN, cost_model, load_profile
from sim.metrics import score
from sim.replay import simulate
from traces.generators import poisson


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--rate", type=float, default=1.5, help="requests/s (the profile serves ~2/s)")
    a = p.parse_args()
    cost = cost_model(load_profile(BUILTIN))
    for n in a.requests:
        trace = poisson(n, a.rate, 64, 512, 32, 128, seed=0)
        for setting in ({"policy": "chunked", "budget": 128, "batch_size": 8}, {"policy": "eager", "batch_size": 8}):
            t0 = time.perf_counter()
            log = simulate(trace, policies.make(**setting, cost=cost), cost)
            t1 = time.perf_counter()
            m = score(log)
            t2 = time.perf_counter()
            calls = log.call_count
            print(f"{n:6d} requests {setting['policy']:8s} {calls:8d} calls  simulate {t1 - t0:6.2f} s "
                  f"({calls / (t1 - t0):9,.0f} calls/s)  metrics {t2 - t1:5.2f} s  "
                  f"simulated makespan {m['makespan_s']:,.0f} s")


if __name__ == "__main__":
    main()
