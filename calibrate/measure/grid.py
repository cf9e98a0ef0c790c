"""The calibration grid: which shapes to time, and how often.

Kernels are fastest on aligned shapes (a chunk of a multiple of 16 rows here), and the engine
mostly runs unaligned ones: real prompts, chunk remainders, batch sizes. So a grid times, besides
the powers of two, chunk lengths spread over their range by a seeded low-discrepancy sequence
(and, in the quick grid, multiples of 8 that are not of 16, so the fit can tell those tiles
apart), every batch size in range, and prefix lengths on both sides of mlx-lm's 256-token
buffer steps.
Joins, leaves and buffer growth are timed on the executor's own path, in short engine runs
(`calibrate.measure.engine_runs`), not here.
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
    warmup: int = 1  # untimed rounds before the first timed one (`calibrate.measure.profiler.warm_up`)
    odd_chunks: list[int] = field(default_factory=list)  # unaligned chunk lengths, each at one offset in turn
    singles: list[int] | None = None  # contexts of single decodes, a request on its own cache (default: contexts)
    offset_chunk_max: int | None = None  # longer `chunks` are timed at offset 0 only (None: at every offset)
    prompt_max: int | None = None  # longest prompt of the engine runs (`calibrate.measure.engine_runs`; None: the longest chunk)
    odd_prompts: list[int] = field(default_factory=list)  # unaligned whole prompts, at offset 0
    # vLLM's one forward (`calibrate.engine.mixed`): [decode rows, their context, prompt tokens, the
    # prompt row's cached prefix], each at once (no prompt row where its tokens are 0)
    fused: list[list[int]] = field(default_factory=list)

    def longest_prompt(self) -> int:
        return self.prompt_max or max(self.chunks)

    def max_context(self) -> int:
        prefills = [p["prefix"] + p["chunk"] for p in self.points() if p["step"] == "prefill"]
        return max(prefills + self.contexts + [max(m) for m in self.mixed]
                   + [max(c, p + n) for _, c, n, p in self.fused] + [0]) + self.warmup + self.repeats + 2

    def points(self) -> list[dict]:
        """Every point to time, as a dict with a stable `key` (for resuming)."""
        pts = [{"step": "prefill", "chunk": c, "prefix": o} for o in self.offsets for c in self.chunks
               if o == 0 or self.offset_chunk_max is None or c <= self.offset_chunk_max]
        pts += [{"step": "prefill", "chunk": c, "prefix": self.offsets[i % len(self.offsets)]}
                for i, c in enumerate(self.odd_chunks)]
        pts += [{"step": "prefill", "chunk": c, "prefix": 0} for c in self.odd_prompts]
        for b in self.batches:
            for ctx in self.contexts:
                pts.append({"step": "decode", "contexts": [ctx] * b, "batched": True})
        pts += [{"step": "decode", "contexts": list(m), "batched": True} for m in self.mixed]
        pts += [{"step": "decode", "contexts": [ctx], "batched": False}
                for ctx in (self.contexts if self.singles is None else self.singles)]
        pts += [{"step": "mixed", "decodes": b, "context": c, "prompt": n, "prompt_prefix": p} for b, c, n, p in self.fused]
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
    if p["step"] == "mixed":
        return f"mixed:{p['decodes']}@{p['context']}+{p['prompt']}@{p['prompt_prefix']}"
    kind = "" if p.get("batched", True) else "single:"
    return f"{p['step']}:{kind}{','.join(map(str, p['contexts']))}"


# A chunk from offset 250 grows the buffer past its 256-token step; the engine runs time growth
# and copies on the executor's own path besides (`calibrate.measure.engine_runs`).
# Decodes: batches 1, 2, 4 and 8 at three contexts, and every other batch size in range at one
# context each (dense(batch) needs one point per size; the attention slope is shared).
# Chunks beyond 64 tokens are timed at offset 0 only: after a prefix they are the grid's dearest
# points (7.5 s for 256 at offset 700 on a 2-core CPU, 13 s a round for both), and the odd chunks
# of 104-237 tokens, each at one of the offsets, time that corner.
# The chunk of 384 and two unaligned ones between 256 and 512 are whole prompts an eager policy
# prefills at once: a token beyond 256 costs 11-14 ms here against 7 ms below it, which no line
# through the shorter chunks foresees (prompts of 276-331 ran 8-12% over such a price), and
# unaligned ones ran 12.1-12.8 ms a token where 384 ran 12.0. The engine runs keep prompts within
# 256, so their five runs take about four minutes.
# Two rounds, and no chunk of 512 or chunks of 128 after a prefix, to stay within ten minutes here:
# a round costs about 105 s, and a quick calibration 469-479 s (four rounds with those three points
# take 697-716 s with four engine runs); with its untimed warm-up round (97 s), 555 s. Fewer
# timings lose little: over ten calibrations a point's median of three is within a median 1-3%
# (p90 3-6%) of its median of four, inside the 5% of repeat noise. Refitted from each point's first two timings, 66 confirmed settings held as many targets
# as from its first three: the six 44 against 43, the tails 34 against 33, all three 24 against 24.
# Refitted without the three points, 54 held about as many: the six 41 -> 38, the tails 30 -> 31,
# all three 22 -> 22.
# `pdsim calibrate --add-rounds` times more rounds.
# vLLM's forwards: 0, 1 and 4 decode rows beside prompt rows of 24-211 tokens (unaligned, as a
# budget's remainders are), 19 points of 0.2-2 s here; and six aligned ones, as a budget's forwards
# are where prompts wait (they fill it): T = 32 and 64 (one to four rows, prompt rows after a
# prefix) and T = 384 and 512. Without the small ones the fit took the aligned price from the
# prefill's tile remainder alone: calibration G priced its 32-token forwards at 1.07 of their
# measured time (H, I and J, with them: 0.97-1.04). Without the large ones the longest was 215 tokens,
# and calibration J's curve through the grid went flat beyond it: a 512-token forward priced 2.58 s
# that ran 4.24-4.71 (H's and I's line: 4.67). The large two cost about 25 s a calibration.
ALIGNED = [[0, 0, 32, 32], [1, 200, 31, 0], [3, 200, 29, 64], [1, 200, 63, 0], [1, 200, 383, 0], [3, 200, 509, 0]]
QUICK = Grid(chunks=[8, 16, 32, 64, 128, 256, 384], offsets=[0, 250, 700], batches=[1, 2, 4, 8],
             contexts=[100, 333, 777], mixed=[[64, 1000], [128, 256, 512, 1000], [96, 96, 96, 96, 900, 900],
                                              [777] * 3, [100] * 5, [333] * 6, [555] * 7],
             repeats=2, warmup=1, odd_chunks=spread(3, 250, 14) + [24, 56, 104], singles=[100, 333, 777],
             offset_chunk_max=64, prompt_max=256, odd_prompts=spread(257, 511, 2),
             fused=[[b, c, n, p] for b, c in ((0, 0), (1, 200), (4, 200), (4, 600))
                    for n, p in ((0, 0), (24, 0), (77, 300), (160, 0), (211, 0)) if b or n] + ALIGNED)
FULL = Grid(chunks=[8, 16, 32, 64, 128, 256, 512], offsets=[0, 128, 250, 262, 1024, 2048],
            batches=list(range(1, 17)), contexts=[64, 256, 1024, 2048],
            mixed=[[64, 2048], [128, 256, 512, 1024], [32] * 7 + [2048], [256, 1024, 1024, 2048, 64, 64]],
            repeats=5, warmup=1, odd_chunks=spread(3, 500, 24))
# A GPU's quick grid covers what `pdsim tune` sweeps there (`sim.commands.tune_capacity`: prompts to
# 1,024 tokens with up to 256 outputs, budgets to 1,024, vLLM's forwards of up to 64 sequences and
# 1,024 tokens), so no pick rests on extrapolation: a GPU times these in the minutes a CPU times QUICK.
QUICK_GPU = Grid(chunks=[8, 16, 32, 64, 128, 256, 512, 1024], offsets=[0, 256, 1024], batches=[1, 2, 4, 8, 16, 32, 64],
                 contexts=[128, 512, 1400], mixed=[[64, 1400], [128, 256, 512, 1024], [32] * 7 + [1400],
                                                  [256] * 16, [900] * 24],
                 repeats=3, warmup=1, odd_chunks=spread(3, 1000, 16) + [24, 56, 104, 300, 700],
                 singles=[128, 512, 1400], offset_chunk_max=256, prompt_max=1024, odd_prompts=spread(257, 1023, 3),
                 fused=[[b, c, n, p] for b, c in ((0, 0), (1, 200), (4, 600), (16, 600), (64, 1400))
                        for n, p in ((0, 0), (24, 0), (77, 300), (211, 0), (700, 0), (1024, 0)) if b or n] + ALIGNED)
# For qwen3-tiny in tests: the same structure, small and fast.
TINY = Grid(chunks=[4, 8, 16, 32], offsets=[0, 16, 48], batches=[1, 2, 3, 4], contexts=[16, 64],
            mixed=[[8, 64]], repeats=3, warmup=1, odd_chunks=spread(3, 30, 4),
            fused=[[b, c, n, p] for b, c in ((0, 0), (1, 20), (3, 40)) for n, p in ((0, 0), (5, 0), (13, 9), (30, 0))
                   if b or n])
GRIDS = {"quick": QUICK, "quick-gpu": QUICK_GPU, "full": FULL, "tiny": TINY}
QUICK_NAME = {"cpu": "quick", "gpu": "quick-gpu"}  # each device kind's quick grid (`--quick`, `pdsim tune`)
QUICK_FOR = {kind: GRIDS[name] for kind, name in QUICK_NAME.items()}


@dataclass
class MlxLmGrid:
    """mlx-lm BatchGenerator's calls to time (`pdsim calibrate --engine mlx-lm`), each on its own
    path (`calibrate.measure.mlxlm_profiler`): prompt calls of several rows (each row's chunk; rows with
    shorter chunks are padded and rolled), at every write position of `offsets` (0: rows with
    empty caches, as a prompt's first chunk); generation steps; first forwards ([rows, prompt
    length]); and joins ([batch rows, their context, joining rows, theirs]: the step that pays
    the generation batch's merge)."""
    prompts: list[list[int]]
    offsets: list[int]
    batches: list[int]
    contexts: list[int]
    firsts: list[list[int]] = field(default_factory=list)
    merges: list[list[int]] = field(default_factory=list)
    repeats: int = 3
    warmup: int = 1  # untimed rounds before the first timed one

    def max_context(self) -> int:
        return max([o + max(p) for o in self.offsets for p in self.prompts] + self.contexts
                   + [x for _, x in self.firsts] + [max(m[1], m[3]) for m in self.merges] + [0]) + 2

    def points(self) -> list[dict]:
        pts = [{"step": "prompt", "chunks": list(p), "idx": o} for o in self.offsets for p in self.prompts]
        pts += [{"step": "generate", "call": "generate", "batch": b, "context": x}
                for b in self.batches for x in self.contexts]
        pts += [{"step": "generate", "call": "first", "batch": b, "context": x} for b, x in self.firsts]
        pts += [{"step": "generate", "call": "merge", "batch": b, "context": x, "joining": j, "joining_context": y}
                for b, x, j, y in self.merges]
        for p in pts:
            p["key"] = mlx_key_of(p)
        return pts

    def to_dict(self) -> dict:
        return asdict(self)


def mlx_key_of(p: dict) -> str:
    if p["step"] == "prompt":
        return f"prompt:{','.join(map(str, p['chunks']))}@{p['idx']}"
    if p["call"] == "merge":
        return f"merge:{p['batch']}@{p['context']}+{p['joining']}@{p['joining_context']}"
    return f"{p['call']}:{p['batch']}@{p['context']}"


# A quick grid for Qwen3-0.6B on a laptop CPU (a prompt row-token ~9 ms): about 100 s a round here.
# One row at each power of two 16-256: a prompt step's calls with one prompt at a time are one row
# of the step (without [32], dense(32) comes from [16, 16] only, and a step of 32's calls are
# priced 1.07x).
# Single prompts of unaligned lengths (`spread`) and calls of 512-642 row-tokens: every other
# prompt call is a multiple of 8 row-tokens and at most 384, so without them an unaligned one's
# remainder is fitted from a handful of the engine runs' calls, and a step of 512 with four
# prompts at a time runs 3 x 214 = 642, beyond the curve's end (such calls were priced 1.06-1.12x).
MLX_QUICK = MlxLmGrid(prompts=[[16], [32], [64], [128], [256], [16, 16], [64, 64], [128, 128], [16] * 4, [32] * 4,
                               [64] * 4, [40, 40, 40], [100, 100], [16] * 8, [64, 16], [128, 32, 8], [40, 16, 3, 40],
                               *([n] for n in spread(3, 250, 6)), [256, 256], [214, 180, 30]],
                      offsets=[0, 400], batches=list(range(1, 9)), contexts=[100, 400, 800],
                      firsts=[[1, 100], [2, 300], [4, 100], [3, 600]],
                      merges=[[2, 300, 1, 100], [4, 600, 2, 200], [1, 100, 3, 500], [6, 400, 1, 400]], repeats=3,
                      warmup=1)
# A GPU's: what `pdsim tune --engine mlx-lm` sweeps there (32 prompts of 64-2,048 tokens, up to 256
# outputs; prefill steps to 2,048, up to 8 prompts and 32 generations at a time): prompt calls to
# 8 x 2,048 row-tokens, generation batches to 32, contexts to 2,400.
MLX_QUICK_GPU = MlxLmGrid(prompts=[[16], [64], [128], [256], [512], [1024], [2048], [128] * 2, [512] * 2, [1024] * 2,
                                   [2048] * 2, [256] * 4, [512] * 4, [2048] * 4, [128] * 8, [512] * 8, [2048] * 8,
                                   [300, 200, 50], [1500, 900, 40, 700], *([n] for n in spread(3, 2000, 6))],
                          offsets=[0, 1024], batches=[1, 2, 4, 8, 12, 16, 24, 32], contexts=[256, 1024, 2400],
                          firsts=[[1, 256], [4, 1024], [8, 2048]],
                          merges=[[4, 1000, 1, 500], [16, 2000, 4, 1000], [1, 200, 8, 2000]], repeats=3, warmup=1)
# For qwen3-tiny in tests: the same structure, small and fast.
MLX_TINY = MlxLmGrid(prompts=[[8], [32], [8, 8], [16, 16, 16], [16, 4], [30, 8, 3]], offsets=[0, 40],
                     batches=[1, 2, 3, 4], contexts=[20, 70], firsts=[[1, 20], [3, 50]],
                     merges=[[2, 30, 1, 10], [1, 10, 2, 60]], repeats=3, warmup=1)
MLX_GRIDS = {"quick": MLX_QUICK, "quick-gpu": MLX_QUICK_GPU, "full": MLX_QUICK, "tiny": MLX_TINY}
MLX_QUICK_FOR = {kind: MLX_GRIDS[name] for kind, name in QUICK_NAME.items()}
