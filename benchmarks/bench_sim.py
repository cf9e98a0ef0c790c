"""Simulator speed: engine calls per wall second, and wall time for a 10,000-request Poisson trace.

Run: python benchmarks/bench_sim.py [--requests N ...] [--kv-limit L ...]. Prints figures; asserts
nothing. The calls/s should not fall as traces grow (per-call cost independent of trace length).
`--kv-limit none 4096 2000` runs each setting under each KV limit (`sim.engine.memory`), with its preemptions.
"""
import argparse
import time

import policies
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.scoring import score
from sim.replay import simulate
from traces.generators import poisson


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--rate", type=float, default=1.5, help="requests/s (the profile serves ~2/s)")
    p.add_argument("--kv-limit", nargs="+", default=["none"], help="KV limits to run each setting under")
    a = p.parse_args()
    cost = cost_model(load_profile(BUILTIN))
    for n in a.requests:
        trace = poisson(n, a.rate, 64, 512, 32, 128, seed=0)
        limits = [None if kv == "none" else kv for kv in a.kv_limit]
        for setting in [{"policy": p, "budget": 128 if p == "chunked" else None, "batch_size": 8, "kv_limit": kv}
                        for p in ("chunked", "eager") for kv in limits]:
            t0 = time.perf_counter()
            log = simulate(trace, policies.make(**setting, cost=cost), cost)
            t1 = time.perf_counter()
            m = score(log)
            t2 = time.perf_counter()
            calls = log.call_count
            kv = f" kv {setting['kv_limit']}: {m['preemptions']} preemptions" if setting["kv_limit"] else ""
            print(f"{n:6d} requests {setting['policy']:8s} {calls:8d} calls  simulate {t1 - t0:6.2f} s "
                  f"({calls / (t1 - t0):9,.0f} calls/s)  metrics {t2 - t1:5.2f} s  "
                  f"simulated makespan {m['makespan_s']:,.0f} s{kv}")


if __name__ == "__main__":
    main()
