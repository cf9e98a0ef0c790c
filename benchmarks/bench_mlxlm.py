"""Simulator speed under the mlx-lm policy against chunked, on the same Poisson trace.

Run: python benchmarks/bench_mlxlm.py [--requests N ...]. Prints figures; asserts nothing. The
mlx-lm policy follows two batch caches by sizes and is priced call by call except in stretches of
generation-only iterations (`sim.steady`); the target is to stay within 2x of chunked's wall time.
"""
import argparse
import gc
import time

import policies
from sim.costmodel import BUILTIN, cost_model, load_profile
from sim.metrics import score
from sim.replay import simulate
from traces.generators import poisson

SETTINGS = (
    {"policy": "chunked", "budget": 128, "batch_size": 8},
    {"policy": "mlx-lm"},  # mlx_lm.server's defaults: step 2048, 8 prompts, 32 generating
    {"policy": "mlx-lm", "prefill_step": 128, "prompt_concurrency": 4, "decode_concurrency": 8},
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
            t2 = time.perf_counter()
            gc.enable()
            base = base or (t1 - t0)
            calls = log.call_count
            label = "/".join(f"{v}" for k, v in setting.items() if k != "policy") or "defaults"
            print(f"{n:6d} requests {setting['policy']:8s} {label:14s} {calls:8d} calls  simulate {t1 - t0:6.2f} s "
                  f"({(t1 - t0) / base:4.2f}x chunked; {calls / (t1 - t0):9,.0f} calls/s)  metrics {t2 - t1:5.2f} s  "
                  f"makespan {m['makespan_s']:,.0f} s")


if __name__ == "__main__":
    main()
