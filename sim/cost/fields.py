"""Checks of one profile field each, for `sim.cost.schema`: the one-line error naming the file
and the field (`Where`), and what a number, a list of numbers, a curve or a grid must be."""
from __future__ import annotations

import math

from sim.core.errors import InputError


class ProfileError(InputError):
    """A profile that cannot be used; the message names the file and the problem."""


class Where:
    """Builds the one-line error: 'profile PATH: FIELD problem'."""

    def __init__(self, path) -> None:
        self.path = path

    def fail(self, field: str, problem: str) -> ProfileError:
        return ProfileError(f"profile {self.path}: {field!r} {problem}")


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def kind(x) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(x), "a number")
MAX_NUMBER = 1e12  # past this a cost (30,000 years) or a size is a corrupt field; sums of such overflow to inf


def cost_value(w: Where, v, field: str, lo: float = 0.0) -> float:
    """A finite number in [lo, MAX_NUMBER] (seconds, or seconds per unit, or a size)."""
    if not is_number(v):
        raise w.fail(field, f"must be a number, got {kind(v)}")
    if not math.isfinite(v):
        raise w.fail(field, f"must be a finite number, got {v}")
    if v < lo:
        raise w.fail(field, f"is {v}: a cost must be >= {lo:g} (a call never takes less than no time)")
    if v > MAX_NUMBER:
        raise w.fail(field, f"is {v:g}: larger than any cost or size a profile holds (at most {MAX_NUMBER:g})")
    return v


def obj(w: Where, v, field: str) -> dict:
    if not isinstance(v, dict):
        raise w.fail(field, f"must be a JSON object, got {kind(v)}")
    return v


def text(w: Where, d: dict, key: str, field: str, required: bool = False) -> None:
    if key not in d:
        if required:
            raise w.fail(field, "is missing")
        return
    if not isinstance(d[key], str) or (required and not d[key].strip()):
        raise w.fail(field, f"must be a {'non-empty ' if required else ''}string, got {kind(d[key])}")


def numbers(w: Where, v, field: str, sizes: tuple[int, ...] | None = None, lo: float = 0.0) -> list:
    if not isinstance(v, list):
        raise w.fail(field, f"must be a list of numbers, got {kind(v)}")
    if sizes is not None and len(v) not in sizes:
        raise w.fail(field, f"must hold {' or '.join(map(str, sizes))} numbers, got {len(v)}")
    for i, x in enumerate(v):
        cost_value(w, x, f"{field}[{i}]", lo)
    return v


def whole(w: Where, v, field: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not is_int(v) or v < lo or (hi is not None and v > hi):
        raise w.fail(field, f"must be a whole number >= {lo}" + (f" and <= {hi:,}" if hi else "") +
                     f", got {v if is_number(v) else kind(v)}")
    return v


def tile(w: Where, sec: dict, field: str) -> None:
    """A step's tile (a whole number of rows) and the remainder's prices (two, or three with a
    price per row of the whole call), where given."""
    if "tile" in sec:
        whole(w, sec["tile"], f"{field}.tile", 0, 1 << 20)
    if "remainder" in sec:
        numbers(w, sec["remainder"], f"{field}.remainder", (2, 3))


def curve(w: Where, v, field: str) -> None:
    if not isinstance(v, list) or not v:
        raise w.fail(field, "must be a non-empty list of [size, seconds] pairs")
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 2:
            raise w.fail(f"{field}[{i}]", "must be a [size, seconds] pair")
        cost_value(w, p[0], f"{field}[{i}][0]")
        cost_value(w, p[1], f"{field}[{i}][1]")
    if any(a[0] >= b[0] for a, b in zip(v, v[1:])):
        raise w.fail(field, "must have its sizes increasing")


def points(w: Where, v, field: str) -> None:
    if not isinstance(v, list) or not v:
        raise w.fail(field, "must be a non-empty list of [size, context, seconds] points")
    for i, p in enumerate(v):
        if not isinstance(p, list) or len(p) != 3:
            raise w.fail(f"{field}[{i}]", "must be a [size, context, seconds] point")
        for j, x in enumerate(p):
            cost_value(w, x, f"{field}[{i}][{j}]")
