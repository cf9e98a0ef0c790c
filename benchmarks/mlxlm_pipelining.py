"""What the mlx-lm confirm's synchronization takes from the server: the same trace served by
mlx-lm's BatchGenerator as `pdsim confirm --engine mlx-lm` drives it (the stream synchronized
before every model call and at the end of every `next()`) and as `mlx_lm.server` drives it
(no synchronization: the generation step's forward still running when `next()` returns, the
clock read at `next()` boundaries only), alternating, in one process after a warm-up pass.

Run: python benchmarks/mlxlm_pipelining.py [--model qwen3-0.6b] [--rounds 2]. Prints each
driver's token-time metrics (a token's time: when `next()` handed it back) and their ratio;
asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from calibrate.engine.batchgen import run_batch_generator
from calibrate.engine.executor import prompt_tokens
from calibrate.engine.mlxlm_batches import G
from calibrate.engine.model import build_model
from traces.generators import gamma


def served(lm, trace, setting: dict) -> dict[str, list[float]]:
    """Each request's token times as the server sees them: `next()` called in a loop, requests
    inserted once the clock passes their arrival, nothing synchronized."""
    gen = G.BatchGenerator(lm.model, completion_batch_size=setting["decode_concurrency"],
                           prefill_batch_size=setting["prompt_concurrency"],
                           prefill_step_size=setting["prefill_step"], stream=mx.default_stream(mx.default_device()))
    t0 = time.perf_counter()
    times: dict[str, list[float]] = {r.id: [] for r in trace.requests}
    rid_of, waiting, active = {}, list(trace.requests), 0
    try:
        while waiting or active:
            now = time.perf_counter() - t0
            new = [r for r in waiting if r.arrival <= now]
            if new:
                waiting = waiting[len(new):]
                uids = gen.insert([prompt_tokens(r, lm.vocab_size) for r in new], max_tokens=[r.output_len for r in new])
                rid_of.update(zip(uids, (r.id for r in new)))
                active += len(new)
            if not active:
                time.sleep(max(0.0, waiting[0].arrival - now))
                continue
            _, out = gen.next()
            at = time.perf_counter() - t0
            for r in out:
                times[rid_of[r.uid]].append(at)
                active -= r.finish_reason is not None
    finally:
        gen.close()
    return times


def figures(trace, times: dict[str, list[float]]) -> dict[str, float]:
    arrival = {r.id: r.arrival for r in trace.requests}
    ttft = [ts[0] - arrival[rid] for rid, ts in times.items()]
    itl = np.concatenate([np.diff(ts) for ts in times.values() if len(ts) > 1])
    return {"ttft_p50_ms": 1e3 * statistics.median(ttft), "ttft_p95_ms": 1e3 * float(np.percentile(ttft, 95)),
            "itl_p50_ms": 1e3 * float(np.median(itl)), "itl_p95_ms": 1e3 * float(np.percentile(itl, 95)),
            "itl_max_ms": 1e3 * float(itl.max()), "itl_min_ms": 1e3 * float(itl.min()),
            "makespan_s": max(ts[-1] for ts in times.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    lm = build_model(args.model)
    trace = gamma(num_requests=12, rate=1.5, burstiness=1 / 3, min_in=9, max_in=333, min_out=3, max_out=21, seed=31)
    setting = {"prefill_step": 64, "prompt_concurrency": 2, "decode_concurrency": 4}
    synced = lambda: {rid: list(ts) for rid, ts in run_batch_generator(lm, trace, setting)[0].log.tokens.items()}
    drivers = {"synchronized (pdsim confirm)": synced, "pipelined (mlx_lm.server)": lambda: served(lm, trace, setting)}
    for d in drivers.values():  # warm-up
        d()
    rows = {name: [] for name in drivers}
    for _ in range(args.rounds):
        for name, d in drivers.items():
            rows[name].append(figures(trace, d()))
    keys = list(next(iter(rows.values()))[0])
    med = {name: {k: statistics.median(f[k] for f in fs) for k in keys} for name, fs in rows.items()}
    (a, fa), (b, fb) = med.items()
    print(f"{args.model}, gamma 12 requests at 1.5/s, mlx-lm {setting}, median of {args.rounds} rounds")
    print(f"{'metric':<14} {a:>30} {b:>30} {'ratio':>7}")
    for k in keys:
        print(f"{k:<14} {fa[k]:>30.1f} {fb[k]:>30.1f} {fb[k] / fa[k] if fa[k] else float('nan'):>7.3f}")


if __name__ == "__main__":
    main()
