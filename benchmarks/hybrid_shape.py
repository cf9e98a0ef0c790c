"""What a chunk costs against the context before it, dense against hybrid: the seeds' claim about
linear attention (a chunk's cost grows with its length, not with the context), measured.

Times one prefill chunk at several cache offsets on a dense Qwen3 and a Qwen3.5 hybrid of similar
size (random weights, the calibration's own step function and sliced caches), and prints each
model's milliseconds per chunk by offset and the least-squares slope per 1,000 tokens of offset.

    python benchmarks/hybrid_shape.py [--chunk 64] [--offsets 0 512 1024 2048] [--repeats 3]

Run on a quiet machine: about four minutes on 2 CPU cores (qwen3-0.6b and qwen3.5-0.8b).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from calibrate.host.blas import ensure_fast_blas

ensure_fast_blas(sys.argv[1:], (sys.argv[0],))  # before MLX loads: the BLAS the calibration times with

from calibrate.engine.kernels import new_cache, prefill_chunk  # noqa: E402
from calibrate.engine.model import build_model  # noqa: E402
from calibrate.measure.profiler import _timed, master_cache, sliced  # noqa: E402


def chunk_ms(name: str, chunk: int, offsets: list[int], repeats: int) -> list[float]:
    lm = build_model(name)
    master = master_cache(lm, max(offsets) + 1)
    ids = list(range(1000, 1000 + chunk))
    out = []
    for o in offsets:
        fresh = lambda: sliced(master, o) if o else new_cache(lm)
        prefill_chunk(lm, fresh(), ids)  # warm-up of this shape
        times = []
        for _ in range(repeats):
            cache = fresh()
            times.append(_timed(lambda: prefill_chunk(lm, cache, ids)))
        out.append(statistics.median(times) * 1e3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", type=int, default=64)
    p.add_argument("--offsets", type=int, nargs="+", default=[0, 512, 1024, 2048])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["qwen3-0.6b", "qwen3.5-0.8b"])
    a = p.parse_args()
    print(f"a {a.chunk}-token chunk, ms (median of {a.repeats}) by cache offset")
    print(f"{'model':14s}" + "".join(f"{o:>9d}" for o in a.offsets) + "   slope ms/1k offset   at 0")
    for name in a.models:
        ms = chunk_ms(name, a.chunk, a.offsets, a.repeats)
        slope = float(np.polyfit(a.offsets, ms, 1)[0]) * 1e3
        print(f"{name:14s}" + "".join(f"{m:9.1f}" for m in ms) + f"   {slope:18.1f}   {slope / ms[0]:5.1%} per 1k")


if __name__ == "__main__":
    main()
