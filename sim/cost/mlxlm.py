"""mlx-lm's BatchGenerator calls priced: its prompt-batch calls, first forwards and generation
steps (`sim.engine.work`), as `pdsim calibrate --engine mlx-lm` times them on BatchGenerator's
own path. A profile without them prices those calls with pdsim's forms (`sim.cost.model`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from sim.cost.curve import Curve, remainder_cost
from sim.engine.pipeline import Pipeline

MLX_PROMPT_FORM = ("dense(rows*L) + c*rows*L*(idx + L) + d*rows*idx, L the longest chunk, idx the batch "
                   "cache's write position (every row attends the whole padded buffer), plus r0 + r1*(rows*L mod "
                   "tile) + r2*rows*L when rows*L is not a multiple of the tile; plus copy*written")
MLX_STEP_FORM = ("generate: dense(batch) + batch*attn(max(context)) as DECODE_FORM; first forward: the same "
                 "plus `first`; plus copy*written + fresh*fresh")
MLX_KINDS = ("prompt", "first", "generate")  # mlx-lm's calls in the log (`sim.engine.work`)


@dataclass
class MlxLmCosts:
    """mlx-lm's calls as `pdsim calibrate --engine mlx-lm` times them on BatchGenerator's own
    path (`MLX_PROMPT_FORM`, `MLX_STEP_FORM`): its prompt call skips the LM head, and its steps
    add a log-softmax over the vocabulary and a Python loop over the rows, so pdsim's forms
    price them a few percent off."""
    prompt_coef: tuple[float, float, float, float]  # a, b, c, d
    step_coef: tuple[float, float, float, float]  # a, b, c, e
    prompt_dense: Curve | None = None  # dense(rows * L), replaces a + b*rows*L
    step_dense: Curve | None = None  # dense(batch), replaces a + b*batch
    knot: float = float("inf")
    first: float = 0.0  # a first forward besides a step on the same rows
    copy: float = 0.0  # seconds per KV token-row written, and more per fresh one
    fresh: float = 0.0
    iteration: float = 0.0  # host work between two next() calls
    prompt_tile: int = 0  # rows*L beyond a multiple of this run slower kernels (0: no such term)
    prompt_rem: tuple[float, ...] = (0.0, 0.0)  # their cost: once if any, per such row[, per row of the call]
    first_copy: float | None = None  # per token-row a first forward writes (None: `copy`; older profiles set it)
    # seconds of a call's price the host spends building its graph, by kind: next() overlaps it with
    # the device's work (`sim.engine.pipeline`); None: a profile before it, its calls one after another
    host: dict[str, float] | None = None
    tail: dict[str, float] | None = None  # device seconds of a call left when its `mx.async_eval` returns

    def copies(self, kind: str, written: int, fresh: int) -> float:
        """A call's KV copies: its rows written, and the ones of them in fresh memory at the
        faults such a row takes (`calibrate.fit.mlxlm.fresh_by_faults`). Profiles that predate it
        (those with a `first_copy` field) put the faults of an average row in `copy` and
        `first_copy` instead."""
        per_row = self.first_copy if kind == "first" and self.first_copy is not None else self.copy
        return per_row * written + self.fresh * fresh

    def pipeline(self) -> Pipeline | None:
        """A run's `Pipeline`, where the profile measured the host's part of each call."""
        return Pipeline(dict(self.host), dict(self.tail or {})) if self.host else None

    def prompt(self, rows: int, tokens: int, idx: int) -> float:
        a, b, c, d = self.prompt_coef
        n = rows * tokens
        dense = self.prompt_dense(n) if self.prompt_dense else a + b * n
        return dense + remainder_cost(n, self.prompt_tile, self.prompt_rem) + c * n * (idx + tokens) + d * rows * idx

    def step(self, contexts: Sequence[int]) -> float:
        a, b, c, e = self.step_coef
        n, x = len(contexts), max(contexts)
        dense = self.step_dense(n) if self.step_dense else a + b * n
        k = self.knot
        return dense + n * (c * min(x, k) + e * max(0.0, x - k))

    def steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        """`step` of `steps` consecutive calls, every context one longer each call."""
        a, b, c, e = self.step_coef
        n, x = len(contexts), np.arange(max(contexts), max(contexts) + steps)
        dense = self.step_dense(n) if self.step_dense else a + b * n
        if self.knot == float("inf"):
            return dense + n * (c * x)
        return dense + n * (c * np.minimum(x, self.knot) + e * np.maximum(0.0, x - self.knot))


def mlx_lm_costs(m: dict) -> MlxLmCosts:
    """`MlxLmCosts` from a profile's `cost.mlx_lm` section."""
    pr, st = m["prompt"], m["generate"]
    return MlxLmCosts(tuple(map(float, pr["coef"])), tuple(map(float, st["coef"])), Curve.from_pairs(pr.get("dense")),
                      Curve.from_pairs(st.get("dense")), float(st.get("knot") or "inf"), float(st.get("first", 0.0)),
                      float(m.get("copy", 0.0)), float(m.get("fresh", 0.0)), float(m.get("iteration", 0.0)),
                      int(pr.get("tile", 0)), tuple(map(float, pr.get("remainder", (0.0, 0.0)))),
                      None if m.get("first_copy") is None else float(m["first_copy"]),
                      {k: float(v) for k, v in m["host"].items()} if m.get("host") else None,
                      {k: float(v) for k, v in m["tail"].items()} if m.get("tail") else None)
