"""Simulator speed: engine calls per wall second for every policy and option, on the built-in
profile and on a CPU profile that prices page faults (so the heap model runs), over Poisson
traces of 1,000 and 10,000 requests.

Run: python benchmarks/bench_sim.py [--requests N ...] [--profile P.json ...] [--only LABEL ...]
Prints one row per (profile, setting, trace size); asserts nothing. Calls/s should not fall as
traces grow (a call's cost independent of the trace's length), and no setting should fall far
below its policy's plain setting.
"""
import argparse
import time
from pathlib import Path

import policies
from policies.settings import setting_label
from sim.cost.profile import BUILTIN, cost_model, load_profile
from sim.metrics.scoring import score
from sim.replay import simulate
from traces.generators import poisson

CPU_PROFILE = Path(__file__).parent / "fixtures" / "cpu-qwen3-0.6b.json"
SETTINGS = [
    {"policy": "chunked", "budget": 128, "batch_size": 8},
    {"policy": "eager", "batch_size": 8},
    {"policy": "fifo"},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "decode": "single"},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "order": "decode-first"},
    {"policy": "chunked", "budget": "auto:40", "batch_size": 8},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "idle_budget": "whole"},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "queue": "sjf"},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "queue": "priority"},
    {"policy": "chunked", "budget": 128, "batch_size": 8, "kv_limit": 4096},
    {"policy": "mlx-lm", "prefill_step": 512, "prompt_concurrency": 4, "decode_concurrency": 8},
    {"policy": "vllm", "max_num_batched_tokens": 256, "max_num_seqs": 8},
    {"policy": "vllm", "max_num_batched_tokens": 512, "max_num_seqs": 8, "long_prefill_token_threshold": 128},
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--rate", type=float, default=1.5, help="requests/s (the built-in profile serves ~2/s)")
    p.add_argument("--profile", nargs="+", default=[str(BUILTIN), str(CPU_PROFILE)])
    p.add_argument("--only", nargs="+", help="settings whose label starts with one of these")
    a = p.parse_args()
    print(f"{'profile':10s} {'setting':34s} {'requests':>8s} {'calls':>9s} {'simulate s':>10s} {'calls/s':>10s} "
          f"{'metrics s':>9s}")
    for path in a.profile:
        cost = cost_model(load_profile(path))
        name = "built-in" if Path(path) == BUILTIN else Path(path).stem[:10]
        for setting in SETTINGS:
            label = setting_label(setting)
            if a.only and not label.startswith(tuple(a.only)):
                continue
            for n in a.requests:
                trace = poisson(n, a.rate, 64, 512, 32, 128, seed=0)
                t0 = time.perf_counter()
                log = simulate(trace, policies.make(**setting, cost=cost), cost)
                t1 = time.perf_counter()
                score(log)
                t2 = time.perf_counter()
                calls = log.call_count
                print(f"{name:10s} {label:34s} {n:8d} {calls:9d} {t1 - t0:10.2f} {calls / (t1 - t0):10,.0f} "
                      f"{t2 - t1:9.2f}", flush=True)


if __name__ == "__main__":
    main()
