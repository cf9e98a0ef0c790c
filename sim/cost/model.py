"""Cost models: how long each engine call takes, in seconds, from its shape alone.

The forms are physically motivated. A prefill chunk of L tokens at a cache offset P pays the dense layers for
L rows, dense(L), attention over the prefix and its own causal triangle, c*L*(P + L/2), and one read of the
prefix's KV cache, d*P. A decode step pays the dense layers for its batch, dense(batch), and attention over
the batch cache, whose rows are left-padded to the longest context (mlx-lm's BatchKVCache): every row pays
max(context), measured 0.996 s for contexts 128/256/512/1024 against 0.995 s for four rows of 1024 on
Qwen3-0.6B. A row's attention is c per token up to a knot and e per token beyond it: a kernel's cost per token
changes with row length (OpenBLAS on this CPU threads the attention products only from ~1,000 tokens, and
beyond that a token costs half as much; measured on Qwen3-1.7B). A profile without a knot has one slope. A
decode of one request may have its own slope, `lone` per token: it runs without the batch cache's mask and
padding, and costs about twice a batch row per token here.

dense(n) is a + b*n, or, when a profile gives measured sizes, a `Curve` through them: the BLAS
picks its kernel by shape, so at small sizes the cost is far from linear (Qwen3-0.6B on this CPU:
batch 4 decodes as slowly as batch 16). A profile may instead ask for interpolation over its grid.

mlx-lm's calls (`sim.engine.work`) are priced by `MlxLmCosts` where calibrated, else by pdsim's forms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from sim.cost.curve import Curve, remainder_cost
from sim.cost.mlxlm import MlxLmCosts
from sim.engine.heap import GROUPS, Heap, NoHeap
from sim.engine.memory import MemoryModel
from sim.engine.pipeline import Pipeline

FEW_ROWS = 16  # an uncalibrated mixed forward of this many tokens or fewer is priced at least as a decode
MIXED_FORM = ("dense(T) + rows*e + sum over rows of c*n*(prefix + n/2) + d*prefix, T the call's tokens, n a row's "
              "tokens (a decode row: 1 after its context); dense(T) = a + b*T or the measured curve, plus the "
              "prefill's remainder at T if `tiled`; uncalibrated, the prefill dense part at T (at least the "
              "decode's up to 16 tokens), each prompt row's prefill attention and each decode row's decode attention")
PREFILL_FORM = ("dense(L) + c*L*(prefix + L/2) + d*prefix; dense(L) = a + b*L or the measured curve, "
                "plus r0 + r1*(L mod tile) + r2*L when L is not a multiple of the tile; plus copy*written")
DECODE_FORM = ("dense(batch) + batch*attn(max(context)); attn(x) = c*min(x, knot) + e*max(0, x - knot); "
               "a single decode (own cache): dense(1) + lone*context; dense(batch) = a + b*batch or the measured "
               "curve; plus copy*written (gather*written in a sync where requests only leave, grow*written in a "
               "decode's own growth, grow_single*written and no fresh price in a single decode's, less its faults "
               "where it meets no fresh memory) and fresh*fresh "
               "rows (fresh_step*fresh in a step's own growth), and join (leave) when requests join (leave) the "
               "batch cache")


class CostModel(Protocol):
    """What every cost model has (`LinearCostModel`, `GridCostModel`, and either at another
    machine speed, `sim.cost.speed.AtSpeed`)."""
    iteration: float  # host work per scheduler iteration (policy, bookkeeping), seconds
    pdsim_forms: bool  # False: a profile of mlx-lm's calls only, which cannot price pdsim's engine
    memory: MemoryModel | None  # the profile's peak-memory model (`sim.engine.memory`), if it has one
    kv_bytes: int | None  # bytes of one KV-cache token of the profile's model, if known
    kv_capacity: int | None  # tokens of KV cache the profile's device holds, if known
    state_tokens: int  # a hybrid model's linear-layer state per request, in KV tokens of memory (0: dense)
    heap_groups: int  # the model's layers, as `sim.engine.heap` follows their arrays
    prices_fresh: bool  # whether a KV token-row in fresh memory costs more than one in reused memory
    prices_kv: bool  # whether a KV token-row written costs anything, or the memory model reads buffer sizes
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

    def pipeline(self, engine: str) -> Pipeline | None:
        """A run's `Pipeline` where this engine's calls overlap the host's work (None: they do not)."""

    def fresh_heap(self) -> Heap | NoHeap:
        """The heap a replay follows: `sim.engine.heap`'s model where fresh memory has a price,
        else one that places nothing (a replay pays only for what its profile prices)."""

    def generate_steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        """mlx-lm: `steps` generation steps of the same rows, no copies; the floats of `steps` calls."""

    def mixed(self, chunks: Sequence[int], prefixes: Sequence[int]) -> float:
        """vLLM's one forward: rows of `chunks[i]` tokens after `prefixes[i]` cached ones (a decode
        row is one token after its context), no copies (`MIXED_FORM`)."""

    def mixed_steps(self, prefixes: Sequence[int], steps: int) -> np.ndarray:
        """`mixed` of `steps` consecutive forwards of the same decode rows, every context one
        longer each forward; the same floats as `steps` calls of `mixed`."""


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
    mixed_coef: tuple[float, ...] | None = None  # a, b, c, d, e of `MIXED_FORM` (None: not calibrated)
    mixed_dense: Curve | None = None  # measured dense(T) of mixed forwards; replaces a + b*T
    mixed_tiled: bool = False  # dense(T) pays the prefill's tile remainder (the same kernels over T rows)
    mlx: MlxLmCosts | None = None  # mlx-lm's calls, when calibrated (else priced by the forms above)
    pdsim_forms: bool = True  # False: a profile of mlx-lm's calls only, which cannot price pdsim's engine
    memory: MemoryModel | None = None  # the profile's peak-memory model (`sim.engine.memory`), if it has one
    kv_bytes: int | None = None  # bytes of one KV-cache token of the profile's model (`sim.engine.memory`), if known
    kv_capacity: int | None = None  # tokens of KV cache the profile's device holds (`sim.engine.memory.device_kv_tokens`)
    state_tokens: int = 0  # a hybrid model's linear-layer state per request, in KV tokens (`sim.engine.memory`)
    heap_groups: int = GROUPS  # the model's layers, as `sim.engine.heap` follows their arrays

    @property
    def prices_fresh(self) -> bool:
        return bool(self.fresh or self.fresh_step or (self.grow_single is not None and self.grow_single_faults)
                    or (self.mlx is not None and self.mlx.fresh))

    def fresh_heap(self) -> Heap | NoHeap:
        return Heap(groups=self.heap_groups) if self.prices_fresh else NoHeap()

    @property
    def prices_kv(self) -> bool:
        return bool(self.copy or self.gather or self.grow or self.grow_single or self.prices_fresh
                    or self.memory is not None or (self.mlx is not None and (self.mlx.copy or self.mlx.first_copy)))

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

    def pipeline(self, engine: str) -> Pipeline | None:
        return self.mlx.pipeline() if engine == "mlx-lm" and self.mlx is not None else None

    def mixed(self, chunks: Sequence[int], prefixes: Sequence[int]) -> float:
        total = sum(chunks)
        if self.mixed_coef is None:  # not calibrated: pdsim's own forms
            dense, c, d = self._prefill_terms(total)
            if total <= FEW_ROWS:  # a few rows cost a decode step's weight read, whichever form says more
                dense = max(dense, self.dense_decode(total))
            return dense + sum(self.attention(1, p) if n == 1 else c * n * (p + n / 2) + d * p
                               for n, p in zip(chunks, prefixes))
        a, b, c, d, e = self.mixed_coef
        dense = self.mixed_dense(total) if self.mixed_dense else a + b * total
        dense += remainder_cost(total, self.prefill_tile, self.prefill_rem) if self.mixed_tiled else 0.0
        return dense + e * len(chunks) + sum(c * n * (p + n / 2) + d * p for n, p in zip(chunks, prefixes))

    def mixed_steps(self, prefixes: Sequence[int], steps: int) -> np.ndarray:
        ahead = np.arange(steps)  # `mixed`'s operations on arrays of prefixes: the same floats, element by element
        return self.mixed((1,) * len(prefixes), [p + ahead for p in prefixes])

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
        return float(self.dense_decode(len(contexts)) + self.attention(len(contexts), max(contexts)))

    def decode_steps(self, contexts: Sequence[int], steps: int, single: bool = False) -> np.ndarray:
        if single:
            return sum(self.dense_decode(1) + self.attention(1, np.arange(c, c + steps), True) for c in contexts)
        n, longest = len(contexts), max(contexts)
        return self.dense_decode(n) + self.attention(n, np.arange(longest, longest + steps))
