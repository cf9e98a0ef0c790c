"""Interpolation over a calibration's measured grid points, where a profile chose it over the
fitted forms (`calibrate.fit.pdsim`): everything else is priced by its `LinearCostModel`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from sim.cost.model import LinearCostModel
from sim.engine.heap import Heap, NoHeap
from sim.engine.memory import MemoryModel
from sim.engine.pipeline import Pipeline


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
    def state_tokens(self) -> int:
        return self.linear.state_tokens

    @property
    def pdsim_forms(self) -> bool:
        return self.linear.pdsim_forms

    @property
    def heap_groups(self) -> int:
        return self.linear.heap_groups

    @property
    def prices_fresh(self) -> bool:
        return self.linear.prices_fresh

    @property
    def prices_kv(self) -> bool:
        return self.linear.prices_kv or self.memory is not None

    def fresh_heap(self) -> Heap | NoHeap:
        return self.linear.fresh_heap()

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

    def pipeline(self, engine: str) -> Pipeline | None:
        return self.linear.pipeline(engine)

    def mixed(self, chunks: Sequence[int], prefixes: Sequence[int]) -> float:
        return self.linear.mixed(chunks, prefixes)

    def mixed_steps(self, prefixes: Sequence[int], steps: int) -> np.ndarray:
        return self.linear.mixed_steps(prefixes, steps)

    def generate_steps(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        return self.linear.generate_steps(contexts, steps) if self.linear.mlx is not None else \
            self.decode_steps(contexts, steps)


def _interpolator(points: np.ndarray):
    """Linear interpolation over (size, context) points; nowhere (NaN) when they span no area."""
    from scipy.interpolate import LinearNDInterpolator
    from scipy.spatial import QhullError
    try:
        return LinearNDInterpolator(points[:, :2], points[:, 2])
    except (QhullError, ValueError, IndexError):
        return lambda *xy: np.full(np.broadcast(*xy).shape, np.nan)
