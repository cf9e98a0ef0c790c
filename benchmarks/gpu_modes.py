"""Is a GPU machine's call time bimodal, and what moves it? `python3 benchmarks/gpu_modes.py [STEPS]`:
single decodes of Qwen3-0.6B (random weights) timed one by one, printed as medians of 25 steps.
On an H200 (stop 35) the same decode took 5 ms in some processes and 9-10 ms in others."""
import statistics
import sys
import time

import mlx.core as mx

from calibrate.engine.kernels import decode_one, new_cache, prefill_chunk
from calibrate.engine.model import build_model

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
lm = build_model("qwen3-0.6b", dtype="float32")
cache = new_cache(lm)
token, _ = prefill_chunk(lm, cache, list(range(1, 65)))
times = []
for _ in range(steps):
    t = time.perf_counter(); token = decode_one(lm, cache, token); times.append(time.perf_counter() - t)
print(" ".join(f"{statistics.median(times[i:i + 25]) * 1e3:.1f}" for i in range(0, steps, 25)), "ms")
