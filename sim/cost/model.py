"""Cost models: how long each engine call takes, in seconds, from its shape alone.

The forms are physically motivated. A prefill chunk of L tokens at a cache offset P pays the
dense layers for L rows, dense(L), attention over the prefix and its own causal triangle,
c*L*(P + L/2), and one read of the prefix's KV cache, d*P. A decode step pays the dense layers
for its batch, dense(batch), and attention over the batch cache, whose rows are left-padded to the
longest context (mlx-lm's BatchKVCache): every row pays max(context), measured 0.996 s for
contexts 128/256/512/1024 against 0.995 s for four rows of 1024 on Qwen3-0.6B. A row's attention
is c per token up to a knot and e per token beyond it: a kernel's cost per token changes with row
length (OpenBLAS on this CPU threads the attention products only from ~1,000 tokens, and beyond
that a token costs half as much; measured on Qwen3-1.7B). A profile without a knot has one slope.
A decode of one request may have its own slope, `lone` per token: it runs without the batch
cache's mask and padding, and costs about twice a batch row per token here.

dense(n) is a + b*n, or, when a profile gives measured sizes, a `Curve` through them: the BLAS
picks its kernel by shape, so at small sizes the cost is far from linear (Qwen3-0.6B on this CPU:
batch 4 decodes as slowly as batch 16). A profile may instead ask for interpolation over its grid.

mlx-lm's BatchGenerator makes other calls (`sim.engine.work`), priced by `MlxLmCosts` when a profile was
calibrated on them (`pdsim calibrate --engine mlx-lm`), and otherwise by pdsim's forms.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from sim.engine.memory import MemoryModel, device_kv_tokens, memory_model, profile_kv_bytes


PREFILL_FORM = ("dense(L) + c*L*(prefix + L/2) + d*prefix; dense(L) = a + b*L or the measured curve, "
                "plus r0 + r1*(L mod tile) + r2*L when L is not a multiple of the tile; plus copy*written")
DECODE_FORM = ("dense(batch) + batch*attn(max(context)); attn(x) = c*min(x, knot) + e*max(0, x - knot); "
               "a single decode (own cache): dense(1) + lone*context; dense(batch) = a + b*batch or the measured "
               "curve; plus copy*written (gather*written in a sync where requests only leave, grow*written in a "
               "decode's own growth, grow_single*written and no fresh price in a single decode's, less its faults "
               "where it meets no fresh memory) and fresh*fresh "
               "rows (fresh_step*fresh in a step's own growth), and join (leave) when requests join (leave) the "
               "batch cache")
MLX_PROMPT_FORM = ("dense(rows*L) + c*rows*L*(idx + L) + d*rows*idx, L the longest chunk, idx the batch "
                   "cache's write position (every row attends the whole padded buffer), plus r0 + r1*(rows*L mod "
                   "tile) + r2*rows*L when rows*L is not a multiple of the tile; plus copy*written")
MLX_STEP_FORM = ("generate: dense(batch) + batch*attn(max(context)) as DECODE_FORM; first forward: the same "
                 "plus `first`; plus copy*written + fresh*fresh")
MLX_KINDS = ("prompt", "first", "generate")  # mlx-lm's calls in the log (`sim.engine.work`)
BUILTIN = Path(__file__).parents[1] / "data" / "illustrative-m4pro-qwen3-0.6b.json"


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file and the problem."""


class CostModel(Protocol):
    iteration: float  # host work per scheduler iteration (policy, bookkeeping), seconds
    copy: float  # seconds per token-row of KV buffer a call allocates and fills (`sim.engine.kvcache`)
    fresh: float  # and more per such row in fresh memory (beyond what the process freed: `sim.engine.kvcache`)
    gather: float | None  # per token-row instead of `copy` in a sync where requests only leave (None: `copy`)
    fresh_step: float | None  # instead of `fresh` where a prefill or decode grows a buffer (None: `fresh`)
    fresh_step_faults: float | None  # of which its page faults, at the calibration's dear price (None: not split)
    grow: float | None  # instead of `copy` per token-row a decode's own growth writes (None: `copy`)
    grow_single: float | None  # per token-row a single decode's own growth writes, fresh or not (None: `grow`)
    grow_single_faults: float | None  # of which its page faults, at the calibration's dear price (None: not split)

    def prefill(self, chunk: int, prefix: int) -> float: ...

    def prefill_steps(self, chunk: int, prefix: int, steps: int) -> np.ndarray:
        """`prefill` of `steps` consecutive chunks of one prompt, each `chunk` tokens further in;
        the same floats as `steps` calls of `prefill`."""

    def decode(self, contexts: Sequence[int], single: bool = False) -> float:
        """One decode call; `single`: a request alone on its own cache (not the batch cache)."""

    def decode_steps(self, contexts: Sequence[int], steps: int, single: bool = False) -> np.ndarray:
        """`decode` of `steps` consecutive calls on the same requests, every context one longer
        each call; the same floats as `steps` calls of `decode`."""

    def membership(self, joined: int, left: int, contexts: Sequence[int]) -> float:
        """Rebuilding the batch cache when requests join or leave it (a copy of every padded row)."""

    def mlx_lm_call(self, kind: str, tokens: int, idx: int, contexts: Sequence[int], written: int,
                    fresh: int) -> float:
        """One of mlx-lm's calls (`MLX_KINDS`), KV copies included."""

    def overhead(self, engine: str) -> float:
        """Host work per iteration of this engine ("pdsim" or "mlx-lm"), seconds."""

    def generate_steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        """mlx-lm: `steps` generation steps of the same rows, no copies; the floats of `steps` calls."""


def is_gather(kind: str, joined: int, left: int) -> bool:
    """A sync in which requests only leave: its rows are written by a gather of the kept rows
    (`BatchKVCache.filter`), priced apart (`gather`) where its calibration timed one. It cost two
    thirds of a join's row on a Xeon VM (40 us against 60) while a pad's rows were counted once;
    with a pad's fill counted as a write of its own (`sim.engine.kvcache`), the two fit alike there
    (37-39 us against 38 in stop 48's refits)."""
    return kind == "sync" and left > 0 and not joined


def is_step_growth(kind: str, joined: int, left: int) -> bool:
    """A prefill or decode that grows a buffer (no batch change inside it): its fresh rows cost a
    fifth of a join's here (1-3 us a page fault against 7-12 us: `benchmarks/kv_faults.py`), so a
    profile may price them apart (`fresh_step`)."""
    return kind in ("prefill", "decode") and not joined and not left


def kv_copies(cost: CostModel, written: int, fresh: int, gather: bool = False, step: bool = False,
              grow: bool = False, single: bool = False) -> float:
    """Seconds a call spends writing KV buffers: per token-row written (a leave's gather, or a
    decode's own growth: `grow`, each at its own price where the profile has one), and more per
    fresh one (a step's growth at its own price, where the profile has one). A single decode's own
    growth (a request's own cache, 256 -> 512 tokens) has one price per row, `grow_single`, where
    the profile has one: measured on meTile's runs it cost 100-980 us a row, a median of about 450,
    as much where the array was larger than any before as where it was not (HISTORY, stop 32), and
    the batch cache's growths cost 50-300. What it costs is its page faults (since stop 36 the fit
    prices them at the dear page: `calibrate.fit.pdsim.fit_grow_single`). Stop 40 tried charging them to
    fresh rows only (by the pooled heap of then): meTile's first growth, which the heap saw as all fresh,
    then priced 512 ms where it ran 278, and fifo's max ITL went from +56% to +83%. So a growth that
    meets any fresh memory pays the faults on every row; one that meets none (the heap already held
    it: after a warm-up that served the trace) pays the row's copy alone, `grow_single` less its
    faults: stop 46's confirm runs' growths in held memory faulted nothing and ran 440-500 ms where
    the faults priced them at 595 (meTile's max ITL +24%, max gap +32%)."""
    if grow and single and cost.grow_single is not None:
        faults = getattr(cost, "grow_single_faults", None)
        return (cost.grow_single if fresh or faults is None else cost.grow_single - faults) * written
    per_row = cost.gather if gather and cost.gather is not None else cost.copy
    if grow and cost.grow is not None:
        per_row = cost.grow
    per_fresh = cost.fresh_step if step and cost.fresh_step is not None else cost.fresh
    return per_row * written + per_fresh * fresh


def call_copies(cost: CostModel, kind: str, joined: int, left: int, written: int, fresh: int,
                single: bool = False) -> float:
    """`kv_copies` of a call of this kind and batch change (a gather, a step's own growth, or neither);
    `single`: a decode of one request on its own cache."""
    step = is_step_growth(kind, joined, left)
    return kv_copies(cost, written, fresh, is_gather(kind, joined, left), step, step and kind == "decode", single)


def remainder_cost(rows: int, tile: int, rem: tuple[float, ...]) -> float:
    """What rows beyond a call's last whole tile add: rem[0] if there are any, rem[1] per such
    row, and rem[2] (where a profile has it) per row of the whole call: an unaligned call of 271
    rows ran 0.5 s over its aligned neighbours where one of 15 ran 0.2 s over, so the slower
    kernel's share grows with the call."""
    r = rows % tile if tile else 0
    return rem[0] + rem[1] * r + (rem[2] * rows if len(rem) > 2 else 0.0) if r else 0.0


@dataclass(frozen=True)
class Curve:
    """Seconds against a size (chunk tokens, batch rows): straight lines between measured sizes,
    flat below the first, and beyond the last along the last segment (never downhill)."""
    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    def __call__(self, x: float) -> float:
        xs, ys = self.sizes, self.seconds
        if x <= xs[0] or len(xs) == 1:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] + max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) * (x - xs[-1])
        i = bisect_right(xs, x)
        return ys[i - 1] + (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1]) * (x - xs[i - 1])

    @staticmethod
    def from_pairs(pairs) -> "Curve | None":
        if not pairs:
            return None
        return Curve(tuple(float(x) for x, _ in pairs), tuple(float(y) for _, y in pairs))


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
    first_copy: float | None = None  # per token-row a first forward writes (None: `copy`; profiles of stops 37-43)

    def copies(self, kind: str, written: int, fresh: int) -> float:
        """A call's KV copies: its rows written, and the ones of them in fresh memory at the
        faults such a row takes (`calibrate.fit.mlxlm.fresh_by_faults`). Profiles of stops 37-43
        put the faults of an average row in `copy` and `first_copy` instead."""
        per_row = self.first_copy if kind == "first" and self.first_copy is not None else self.copy
        return per_row * written + self.fresh * fresh

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


@dataclass
class LinearCostModel:
    prefill_coef: tuple[float, ...]  # a, b, c[, d]
    decode_coef: tuple[float, ...]  # a, b, c[, e]
    iteration: float = 0.0
    # a + b*batch + c*batch*max(context), once per call where requests join (leave): the batch
    # cache's left-padded rows are copied, and the first step on the new buffers is slower
    join: tuple[float, float, float] = (0.0, 0.0, 0.0)
    leave: tuple[float, float, float] = (0.0, 0.0, 0.0)
    prefill_dense: Curve | None = None  # measured dense(L); replaces a + b*L
    decode_dense: Curve | None = None  # measured dense(batch); replaces a + b*batch
    decode_knot: float = float("inf")  # context where a row's attention slope goes from c to e
    decode_lone: float | None = None  # a single decode's attention per context token (None: a batch row's)
    copy: float = 0.0  # seconds per token-row of KV buffer allocated and filled in a call
    fresh: float = 0.0  # more per token-row of it in fresh memory (beyond what the process freed)
    gather: float | None = None  # per token-row written by a sync where requests only leave (None: `copy`)
    fresh_step: float | None = None  # per fresh token-row of a prefill's or decode's growth (None: `fresh`)
    fresh_step_faults: float | None = None  # of which its page faults, at the calibration's dear price (None: not split)
    grow: float | None = None  # per token-row a decode's own growth writes (None: `copy`)
    grow_single: float | None = None  # per token-row a single decode's own growth writes, fresh or not (None: `grow`)
    grow_single_faults: float | None = None  # of which its page faults, at the calibration's dear price (None: not split)
    prefill_tile: int = 0  # chunk rows beyond a multiple of this run slower kernels (0: no such term)
    prefill_rem: tuple[float, ...] = (0.0, 0.0)  # their cost: once if any, per such row[, per row of the chunk]
    mlx: MlxLmCosts | None = None  # mlx-lm's calls, when calibrated (else priced by the forms above)
    pdsim_forms: bool = True  # False: a profile of mlx-lm's calls only, which cannot price pdsim's engine
    memory: MemoryModel | None = None  # the profile's peak-memory model (`sim.engine.memory`), if it has one
    kv_bytes: int | None = None  # bytes of one KV-cache token of the profile's model (`sim.engine.memory`), if known
    kv_capacity: int | None = None  # tokens of KV cache the profile's device holds (`sim.engine.memory.device_kv_tokens`)

    def mlx_lm_call(self, kind: str, tokens: int, idx: int, contexts: Sequence[int], written: int,
                    fresh: int) -> float:
        m = self.mlx
        if m is None:  # not calibrated: the nearest of pdsim's own calls
            t = self.copy * written + self.fresh * fresh
            if kind == "prompt":
                dense, c, d = self._prefill_terms(len(contexts) * tokens)
                return t + dense + len(contexts) * (c * tokens * (idx + tokens / 2) + d * idx)
            return t + self.decode(contexts)
        t = m.copies(kind, written, fresh)
        if kind == "prompt":
            return t + m.prompt(len(contexts), tokens, idx)
        return t + m.step(contexts) + (m.first if kind == "first" else 0.0)

    def overhead(self, engine: str) -> float:
        return self.mlx.iteration if engine == "mlx-lm" and self.mlx is not None else self.iteration

    def generate_steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        return self.mlx.steps(contexts, steps) if self.mlx is not None else self.decode_steps(contexts, steps)

    def membership(self, joined: int, left: int, contexts: Sequence[int]) -> float:
        n, longest, t = len(contexts), max(contexts), 0.0
        for happened, (a, b, c) in ((joined, self.join), (left, self.leave)):
            if happened:
                t += a + b * n + c * n * longest
        return t

    def __post_init__(self) -> None:
        self.prefill_coef = (tuple(self.prefill_coef) + (0.0,))[:4]  # a, b, c, d: d = 0 in 3-number profiles
        self.decode_coef = (tuple(self.decode_coef) + (self.decode_coef[2],))[:4]  # a, b, c, e: one slope in 3-number ones

    def _prefill_terms(self, chunk: int) -> tuple[float, float, float]:
        a, b, c, d = self.prefill_coef
        dense = self.prefill_dense(chunk) if self.prefill_dense else a + b * chunk
        return dense + remainder_cost(chunk, self.prefill_tile, self.prefill_rem), c, d

    def prefill(self, chunk: int, prefix: int) -> float:
        dense, c, d = self._prefill_terms(chunk)
        return dense + c * chunk * (prefix + chunk / 2) + d * prefix

    def prefill_steps(self, chunk: int, prefix: int, steps: int) -> np.ndarray:
        dense, c, d = self._prefill_terms(chunk)
        prefixes = np.arange(prefix, prefix + steps * chunk, chunk)
        return dense + c * chunk * (prefixes + chunk / 2) + d * prefixes

    def dense_decode(self, n: int) -> float:
        """dense(batch): the decode step's cost apart from attention."""
        a, b, _, _ = self.decode_coef
        return self.decode_dense(n) if self.decode_dense else a + b * n

    def attention(self, n: int, longest, single: bool = False):
        """A decode's attention: n rows padded to `longest` cached tokens (a number or an array)."""
        if single and self.decode_lone is not None:
            return self.decode_lone * longest
        _, _, c, e = self.decode_coef
        k = self.decode_knot
        if k == math.inf:
            return n * c * longest
        if isinstance(longest, np.ndarray):
            return n * (c * np.minimum(longest, k) + e * np.maximum(0.0, longest - k))
        return n * (c * min(longest, k) + e * max(0.0, longest - k))  # one call, the replay's hot path: no numpy

    def decode(self, contexts: Sequence[int], single: bool = False) -> float:
        if single:  # one call per request, each on its own cache
            return float(sum(self.dense_decode(1) + self.attention(1, c, True) for c in contexts))
        n = len(contexts)
        return float(self.dense_decode(n) + self.attention(n, max(contexts)))

    def decode_steps(self, contexts: Sequence[int], steps: int, single: bool = False) -> np.ndarray:
        if single:
            return sum(self.dense_decode(1) + self.attention(1, np.arange(c, c + steps), True) for c in contexts)
        n, longest = len(contexts), max(contexts)
        return self.dense_decode(n) + self.attention(n, np.arange(longest, longest + steps))


@dataclass
class GridCostModel:
    """Linear interpolation over measured grid points, for shapes the linear form fits badly.

    Prefill interpolates over (chunk, prefix); decode over (batch, longest context). Outside the grid
    it falls back to the linear form, so a long trace never hits a hole.
    """
    linear: LinearCostModel
    prefill_points: np.ndarray  # rows: chunk, prefix, seconds
    decode_points: np.ndarray  # rows: batch, longest context, seconds
    iteration: float = 0.0
    grid_prefill: bool = True  # interpolate this step (False: the linear form prices it)
    grid_decode: bool = True
    _prefills: dict = field(default_factory=dict, repr=False)  # (chunk, prefix) -> seconds
    _decode_rows: dict = field(default_factory=dict, repr=False)  # batch -> seconds by longest context
    memory: MemoryModel | None = None  # the profile's peak-memory model (`sim.engine.memory`), if it has one

    def __post_init__(self) -> None:
        self._pf = _interpolator(self.prefill_points)
        self._dc = _interpolator(self.decode_points)

    def prefill(self, chunk: int, prefix: int) -> float:
        if not self.grid_prefill:
            return self.linear.prefill(chunk, prefix)
        key = (chunk, prefix)
        if key not in self._prefills:
            v = float(self._pf(chunk, prefix))
            self._prefills[key] = v if np.isfinite(v) else self.linear.prefill(chunk, prefix)
        return self._prefills[key]

    def prefill_steps(self, chunk: int, prefix: int, steps: int) -> np.ndarray:
        if not self.grid_prefill:
            return self.linear.prefill_steps(chunk, prefix, steps)
        return np.array([self.prefill(chunk, prefix + j * chunk) for j in range(steps)])

    @property
    def copy(self) -> float:
        return self.linear.copy

    @property
    def gather(self) -> float | None:
        return self.linear.gather

    @property
    def kv_bytes(self) -> int | None:
        return self.linear.kv_bytes

    @property
    def kv_capacity(self) -> int | None:
        return self.linear.kv_capacity

    @property
    def fresh(self) -> float:
        return self.linear.fresh

    @property
    def fresh_step(self) -> float | None:
        return self.linear.fresh_step

    @property
    def fresh_step_faults(self) -> float | None:
        return self.linear.fresh_step_faults

    @property
    def grow(self) -> float | None:
        return self.linear.grow

    @property
    def grow_single(self) -> float | None:
        return self.linear.grow_single

    @property
    def grow_single_faults(self) -> float | None:
        return self.linear.grow_single_faults

    def decode(self, contexts: Sequence[int], single: bool = False) -> float:
        if single or not self.grid_decode:
            return self.linear.decode(contexts, single)
        n, longest = len(contexts), max(contexts)
        if longest != int(longest):  # a fractional context (a fit's mean context): no row for it
            return float(self._decode_at(n, np.array([longest], float))[0])
        return float(self._decode_row(n, int(longest) + 1)[int(longest)])

    def decode_steps(self, contexts: Sequence[int], steps: int, single: bool = False) -> np.ndarray:
        if single or not self.grid_decode:
            return self.linear.decode_steps(contexts, steps, single)
        longest = max(contexts)
        return self._decode_row(len(contexts), longest + steps)[longest:longest + steps].copy()

    def _decode_row(self, batch: int, size: int) -> np.ndarray:
        """Decode seconds for `batch` requests at every longest context below `size` (at least);
        computed once per batch size, in doubling blocks, since a replay revisits the same shapes."""
        row = self._decode_rows.get(batch)
        if row is None or len(row) < size:
            row = self._decode_rows[batch] = self._decode_at(batch, np.arange(max(1024, 1 << (size - 1).bit_length())))
        return row

    def _decode_at(self, batch: int, longest: np.ndarray) -> np.ndarray:
        """Interpolated seconds at these longest contexts; the linear form outside the grid."""
        v = self._dc(np.full(len(longest), batch), longest)
        linear = self.linear.dense_decode(batch) + self.linear.attention(batch, longest)
        return np.where(np.isfinite(v), v, linear)

    def membership(self, joined: int, left: int, contexts: Sequence[int]) -> float:
        return self.linear.membership(joined, left, contexts)

    def mlx_lm_call(self, kind: str, tokens: int, idx: int, contexts: Sequence[int], written: int,
                    fresh: int) -> float:
        return self.linear.mlx_lm_call(kind, tokens, idx, contexts, written, fresh)

    def overhead(self, engine: str) -> float:
        return self.linear.overhead(engine) if engine == "mlx-lm" else self.iteration

    def generate_steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        if self.linear.mlx is not None:
            return self.linear.generate_steps(contexts, steps)
        return self.decode_steps(contexts, steps)


def _interpolator(points: np.ndarray):
    """Linear interpolation over (size, context) points; nowhere (NaN) when they span no area."""
    from scipy.interpolate import LinearNDInterpolator
    from scipy.spatial import QhullError
    try:
        return LinearNDInterpolator(points[:, :2], points[:, 2])
    except (QhullError, ValueError, IndexError):
        return lambda *xy: np.full(np.broadcast(*xy).shape, np.nan)


def load_profile(path: str | Path) -> dict:
    """Read and check a profile JSON (`sim.cost.schema`); ProfileError with one line on any problem."""
    from sim.cost.schema import read_profile
    return read_profile(path)


def cost_model(prof: dict) -> LinearCostModel | GridCostModel:
    """The cost model a profile asks for: each step's `use` ("fit", the default, or "grid"; profiles
    before per-step choices say it once, as `cost.use`)."""
    c = prof["cost"]
    mlx = mlx_lm_costs(c["mlx_lm"]) if "mlx_lm" in c else None
    memory, kv_bytes, capacity = memory_model(prof), profile_kv_bytes(prof), device_kv_tokens(prof)
    if "prefill" not in c:  # a profile of mlx-lm's calls only
        return LinearCostModel((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), mlx=mlx, pdsim_forms=False, memory=memory,
                               kv_bytes=kv_bytes, kv_capacity=capacity)
    lin = LinearCostModel(tuple(c["prefill"]["coef"]), tuple(c["decode"]["coef"]), float(c.get("iteration", 0.0)),
                          join=_triple(c.get("join")), leave=_triple(c.get("leave")),
                          prefill_dense=Curve.from_pairs(c["prefill"].get("dense")),
                          decode_dense=Curve.from_pairs(c["decode"].get("dense")),
                          decode_knot=float(c["decode"].get("knot") or "inf"), decode_lone=c["decode"].get("lone"),
                          copy=float(c.get("copy", 0.0)), fresh=float(c.get("fresh", 0.0)),
                          gather=None if c.get("gather") is None else float(c["gather"]),
                          fresh_step=None if c.get("fresh_step") is None else float(c["fresh_step"]),
                          fresh_step_faults=None if c.get("fresh_step_faults") is None
                          else float(c["fresh_step_faults"]),
                          grow=None if c.get("grow") is None else float(c["grow"]),
                          grow_single=None if c.get("grow_single") is None else float(c["grow_single"]),
                          grow_single_faults=None if c.get("grow_single_faults") is None
                          else float(c["grow_single_faults"]),
                          prefill_tile=int(c["prefill"].get("tile", 0)),
                          prefill_rem=tuple(c["prefill"].get("remainder", (0.0, 0.0))), mlx=mlx, memory=memory,
                          kv_bytes=kv_bytes, kv_capacity=capacity)
    grid = {step: c[step].get("use", c.get("use", "fit")) == "grid" for step in ("prefill", "decode")}
    if any(grid.values()):
        return GridCostModel(lin, np.asarray(c["prefill"]["grid"], float), np.asarray(c["decode"]["grid"], float),
                             lin.iteration, grid["prefill"], grid["decode"], memory=memory)
    return lin


def mlx_lm_costs(m: dict) -> MlxLmCosts:
    """`MlxLmCosts` from a profile's `cost.mlx_lm` section."""
    pr, st = m["prompt"], m["generate"]
    return MlxLmCosts(tuple(map(float, pr["coef"])), tuple(map(float, st["coef"])), Curve.from_pairs(pr.get("dense")),
                      Curve.from_pairs(st.get("dense")), float(st.get("knot") or "inf"), float(st.get("first", 0.0)),
                      float(m.get("copy", 0.0)), float(m.get("fresh", 0.0)), float(m.get("iteration", 0.0)),
                      int(pr.get("tile", 0)), tuple(map(float, pr.get("remainder", (0.0, 0.0)))),
                      None if m.get("first_copy") is None else float(m["first_copy"]))


def _triple(v) -> tuple[float, float, float]:
    """`join`/`leave` coefficients (a, b, c); a bare number is a constant cost."""
    v = [] if v is None else [v] if isinstance(v, (int, float)) else list(v)
    return tuple(float(x) for x in (v + [0.0, 0.0, 0.0])[:3])


def check_profile_matches(prof: dict, model: str | None = None, device: str | None = None,
                          force: bool = False) -> list[str]:
    """Refuse a profile made for another model or device; with force, return warnings instead."""
    problems = []
    if model and prof["model"]["name"] != model:
        problems.append(f"profile {prof.get('_path', '')} is for model {prof['model']['name']!r}, not {model!r}")
    have = prof["device"].get("id")
    if device and have and have != device:
        problems.append(f"profile {prof.get('_path', '')} was measured on {have!r}, this is {device!r}")
    if problems and not force:
        raise ProfileError(problems[0] + " (pass --force to use it anyway)")
    return problems
