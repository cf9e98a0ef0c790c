"""What a token-row of KV buffer costs to write in each operation a join or leave runs.

`sim.engine.kvcache` counts a pad's rows twice (`mx.pad` fills the new array, then copies the old rows
in) and a concatenation's or a gather's once. This times the three on arrays shaped as one
Qwen3-0.6B batch cache (28 layers, keys and values, 8 heads of 128 floats), in a process that
keeps freed memory as the engine's does (`calibrate.host.malloc`), and prints microseconds per
token-row of output, the median of several repeats after the first (which faults its memory in).
Stop 48 on the Xeon VM (2 vCPUs): pad 73-88, concatenate 43-48, gather 32-36.

    python3 benchmarks/pad_passes.py [--repeats N]
"""
from __future__ import annotations

import argparse
import statistics
import time

from calibrate.host.malloc import keep_freed_memory

keep_freed_memory()
import mlx.core as mx  # noqa: E402  (after glibc is set to keep freed memory)

from sim.commands.common import whole  # noqa: E402  (it imports MLX too)

LAYERS, HEADS, DIM = 28, 8, 128


def buffers(batch: int, tokens: int) -> list[mx.array]:
    out = [mx.random.normal((batch, HEADS, tokens, DIM)) for _ in range(2 * LAYERS)]
    mx.eval(out)
    return out


def per_row(fn, rows: int, repeats: int = 7) -> float:
    """Microseconds per output token-row of `fn`'s arrays, the median of the repeats after the first."""
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        mx.eval(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:]) / rows * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description="per token-row cost of a pad, a concatenation and a gather")
    p.add_argument("--repeats", type=whole(1, 1000), default=7, help="timed repeats after the first (1-1000)")
    repeats = p.parse_args().repeats
    print("batch tokens | pad   concatenate gather (us per output token-row)")
    for batch, tokens in ((1, 264), (3, 384), (4, 512)):
        held, joining = buffers(batch, tokens), buffers(1, tokens)
        shift = [(0, 0), (0, 0), (16, 0), (0, 0)]  # a batch shifted 16 positions, as a join's pad
        pad = per_row(lambda: [mx.pad(a, shift) for a in held], batch * (tokens + 16), repeats)
        cat = per_row(lambda: [mx.concatenate([a, b]) for a, b in zip(held, joining)], (batch + 1) * tokens, repeats)
        keep = mx.array(list(range(max(1, batch - 1))))
        gather = per_row(lambda: [a[keep] for a in held], max(1, batch - 1) * tokens, repeats)
        print(f"{batch:5d} {tokens:6d} | {pad:5.1f} {cat:11.1f} {gather:6.1f}")


if __name__ == "__main__":
    main()
