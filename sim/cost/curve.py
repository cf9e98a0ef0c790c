"""Measured curves: seconds against a size, and what an unaligned call's remainder adds.

A BLAS picks its kernel by shape, so at small sizes a dense layer's cost is far from linear in
its rows (Qwen3-0.6B on a 2-vCPU Xeon: batch 4 decodes as slowly as batch 16); a profile then
gives the measured sizes and the cost model draws straight lines between them. Rows beyond a
multiple of the kernel's tile run a slower kernel: `remainder_cost` prices them.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field


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
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # a replay asks the same sizes again

    def __call__(self, x: float) -> float:
        got = self._memo.get(x)
        if got is None:
            got = self._memo[x] = self._at(x)
        return got

    def _at(self, x: float) -> float:
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
