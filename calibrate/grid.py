"""The calibration grid: which shapes to time, and how often.

Kernels are fastest on aligned shapes (a chunk of a multiple of 16 rows here), and the engine
mostly runs unaligned ones: real prompts, chunk remainders, batch sizes. So a grid times, besides
the powers of two, chunk lengths spread over their range by a seeded low-discrepancy sequence
(and, in the quick grid, multiples of 8 that are not of 16, so the fit can tell those tiles
apart), every batch size in range, and prefix lengths on both sides of mlx-lm's 256-token
buffer steps.
Joins, leaves and buffer growth are timed on the executor's own path, in short engine runs
(`calibrate.replay`), not here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


def spread(lo: int, hi: int, n: int, seed: int = 0) -> list[int]:
    """n integers in [lo, hi] spread evenly and irregularly (a golden-ratio sequence): unaligned
    values across the range, the same ones for the same seed."""
    phi, out, x = 0.6180339887498949, [], (seed * 0.7548776662466927) % 1.0
    while len(out) < n:
        x = (x + phi) % 1.0
        v = lo + int(x * (hi - lo + 1))
        if v not in out:
            out.append(v)
    return sorted(out)


@dataclass
class Grid:
    chunks: list[int]  # prefill chunk lengths, timed at every offset
    offsets: list[int]  # cache offsets (tokens already in the cache) for prefill
    batches: list[int]  # decode batch sizes
    contexts: list[int]  # decode context lengths (every request equal)
    mixed: list[list[int]] = field(default_factory=list)  # decode batches with mixed contexts
    repeats: int = 3  # rounds: each times every point once, in its own shuffled order
    warmup: int = 1  # untimed runs on a point's first visit (the master cache's real chunk warms every kernel once anyway)
    odd_chunks: list[int] = field(default_factory=list)  # unaligned chunk lengths, each at one offset in turn
    singles: list[int] | None = None  # contexts of single decodes, a request on its own cache (default: contexts)

    def max_context(self) -> int:
        return max([o + c for o in self.offsets for c in self.chunks + self.odd_chunks] + self.contexts
                   + [max(m) for m in self.mixed] + [0]) + self.warmup + self.repeats + 2

    def points(self) -> list[dict]:
        """Every point to time, as a dict with a stable `key` (for resuming)."""
        pts = [{"step": "prefill", "chunk": c, "prefix": o} for o in self.offsets for c in self.chunks]
        pts += [{"step": "prefill", "chunk": c, "prefix": self.offsets[i % len(self.offsets)]}
                for i, c in enumerate(self.odd_chunks)]
        for b in self.batches:
            for ctx in self.contexts:
                pts.append({"step": "decode", "contexts": [ctx] * b, "batched": True})
        pts += [{"step": "decode", "contexts": list(m), "batched": True} for m in self.mixed]
        pts += [{"step": "decode", "contexts": [ctx], "batched": False}
                for ctx in (self.contexts if self.singles is None else self.singles)]
        pts.append({"step": "overhead"})
        unique = {}
        for p in pts:
            unique.setdefault(key_of(p), dict(p, key=key_of(p)))
        return list(unique.values())

    def to_dict(self) -> dict:
        return asdict(self)


def key_of(p: dict) -> str:
    if p["step"] == "prefill":
        return f"prefill:{p['chunk']}@{p['prefix']}"
    if p["step"] == "overhead":
        return "overhead"
    kind = "" if p.get("batched", True) else "single:"
    return f"{p['step']}:{kind}{','.join(map(str, p['contexts']))}"


# A chunk from offset 250 grows the buffer past its 256-token step; the engine runs time growth
# and copies on the executor's own path besides (`calibrate.replay`).
# Decodes: batches 1, 2, 4 and 8 at three contexts, and every other batch size in range at one
# context each (dense(batch) needs one point per size; the attention slope is shared).
QUICK = Grid(chunks=[8, 16, 32, 64, 128, 256], offsets=[0, 250, 700], batches=[1, 2, 4, 8],
             contexts=[100, 333, 777], mixed=[[64, 1000], [128, 256, 512, 1000], [96, 96, 96, 96, 900, 900],
                                              [777] * 3, [100] * 5, [333] * 6, [555] * 7],
             repeats=4, warmup=0, odd_chunks=spread(3, 250, 14) + [24, 56, 104], singles=[100, 333, 777])
FULL = Grid(chunks=[8, 16, 32, 64, 128, 256, 512], offsets=[0, 128, 250, 262, 1024, 2048],
            batches=list(range(1, 17)), contexts=[64, 256, 1024, 2048],
            mixed=[[64, 2048], [128, 256, 512, 1024], [32] * 7 + [2048], [256, 1024, 1024, 2048, 64, 64]],
            repeats=5, warmup=1, odd_chunks=spread(3, 500, 24))
# For qwen3-tiny in tests: the same structure, small and fast.
TINY = Grid(chunks=[4, 8, 16, 32], offsets=[0, 16, 48], batches=[1, 2, 3, 4], contexts=[16, 64],
            mixed=[[8, 64]], repeats=3, warmup=1, odd_chunks=spread(3, 30, 4))
GRIDS = {"quick": QUICK, "full": FULL, "tiny": TINY}
