"""The calibration grid: which shapes to time, and how often."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Grid:
    chunks: list[int]  # prefill chunk lengths
    offsets: list[int]  # cache offsets (tokens already in the cache) for prefill
    batches: list[int]  # decode batch sizes
    contexts: list[int]  # decode context lengths (every request equal)
    mixed: list[list[int]] = field(default_factory=list)  # decode batches with mixed contexts
    repeats: int = 3  # rounds: each times every point once, in its own shuffled order
    warmup: int = 1  # untimed runs on a point's first visit (the master cache's real chunk warms every kernel once anyway)
    copy_batches: list[int] | None = None  # batch sizes for join/leave points (default: all but 1)

    def max_context(self) -> int:
        return max([o + c for o in self.offsets for c in self.chunks] + self.contexts
                   + [max(m) for m in self.mixed] + [0]) + self.warmup + self.repeats + 2

    def points(self) -> list[dict]:
        """Every point to time, as a dict with a stable `key` (for resuming)."""
        pts = [{"step": "prefill", "chunk": c, "prefix": o} for o in self.offsets for c in self.chunks]
        for b in self.batches:
            for ctx in self.contexts:
                pts.append({"step": "decode", "contexts": [ctx] * b, "batched": b > 1})
        pts += [{"step": "decode", "contexts": list(m), "batched": True} for m in self.mixed]
        mid = sorted(self.contexts)[len(self.contexts) // 2]
        for ctx in sorted({min(self.contexts), mid}):  # batch copies scale with context (extrapolated above)
            for b in self.copy_batches or self.batches:
                if b > 1:
                    pts.append({"step": "join", "contexts": [ctx] * b})
                    pts.append({"step": "leave", "contexts": [ctx] * b})
        pts.append({"step": "overhead"})
        for p in pts:
            p["key"] = key_of(p)
        return pts

    def to_dict(self) -> dict:
        return asdict(self)


def key_of(p: dict) -> str:
    if p["step"] == "prefill":
        return f"prefill:{p['chunk']}@{p['prefix']}"
    if p["step"] == "overhead":
        return "overhead"
    kind = "" if p.get("batched", True) else "single:"
    return f"{p['step']}:{kind}{','.join(map(str, p['contexts']))}"


QUICK = Grid(chunks=[8, 16, 32, 64, 128, 256], offsets=[0, 256, 768], batches=[1, 2, 4, 8],
             contexts=[128, 512, 1024], mixed=[[64, 1024], [128, 256, 512, 1024], [96, 96, 96, 96, 960, 960]],
             repeats=5, warmup=0, copy_batches=[2, 4])
FULL = Grid(chunks=[8, 16, 32, 64, 128, 256, 512], offsets=[0, 128, 512, 1024, 2048],
            batches=[1, 2, 4, 8, 16], contexts=[64, 256, 1024, 2048],
            mixed=[[64, 2048], [128, 256, 512, 1024], [32] * 7 + [2048], [256, 1024, 1024, 2048, 64, 64]],
            repeats=5, warmup=1)
# For qwen3-tiny in tests: the same structure, small and fast.
TINY = Grid(chunks=[4, 8, 16, 32], offsets=[0, 16, 48], batches=[1, 2, 4], contexts=[16, 64],
            mixed=[[8, 64]], repeats=3, warmup=1)
GRIDS = {"quick": QUICK, "full": FULL, "tiny": TINY}
