"""One schema for trace rows: every loader turns its fields into numbers through these checks.

Why one place: a pdsim JSONL row, a Mooncake line and a CSV field must mean the same thing and
refuse the same things, so a trace is never read one way by one format and another way by the
next (pdsim JSONL used to truncate a prompt length of 3.5 to 3 and read `true` as 1, where the
CSV loaders refused 3.5).

- A token count is a whole number: an integer, or a number with nothing after the point
  (`12`, `12.0`); never a fraction, a boolean, a string in JSON, or more than `MAX_TOKENS`
  (a longer prompt than any model holds is a corrupt field, and a simulator asked to follow
  10^18 tokens of KV cache would try to allocate petabytes).
- A time is a finite number of seconds: `Infinity` and `NaN` are refused (a request arriving at
  infinity is never served, and the makespan becomes infinite without a word).
- A flag is a JSON boolean; an id is a string or a whole number.

The checks raise `FieldError` with the problem only; the caller says where (file and line).
"""
from __future__ import annotations

import math

MAX_TOKENS = 1 << 24  # 16,777,216: a prompt or output budget beyond any model's context
MAX_ID_CHARS = 200


class FieldError(ValueError):
    """One field that breaks the schema; the message is the problem, the caller adds where."""


def count(value, what: str) -> int:
    """A JSON token count: a whole number in [0, MAX_TOKENS]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"{what} must be a whole number, got {_show(value)}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FieldError(f"{what} must be a whole number, got {_show(value)}")
        if not value.is_integer():
            raise FieldError(f"{what} {value!r} is not a whole number")
        value = int(value)
    return _bounded(value, what)


def _bounded(v: int, what: str) -> int:
    if v < 0:
        raise FieldError(f"negative {what} ({v})")
    if v > MAX_TOKENS:
        raise FieldError(f"{what} {v} is larger than any model's context (at most {MAX_TOKENS:,} tokens)")
    return v


def text_count(text: str, what: str) -> int:
    """A token count written as text (a CSV field): `12` or `12.0`, in [0, MAX_TOKENS]."""
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise FieldError(f"{what} {text.strip()[:40]!r} is not a number") from None
        if not math.isfinite(f):
            raise FieldError(f"{what} {text.strip()[:40]!r} is not a whole number")
        if not f.is_integer():
            raise FieldError(f"{what} {text.strip()[:40]!r} is not a whole number")
        v = int(f)
    return _bounded(v, what)


def seconds(value, what: str, scale: float = 1.0) -> float:
    """A JSON time: a finite number, in seconds after multiplying by `scale`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"{what} must be a number of seconds, got {_show(value)}")
    return _finite(float(value) * scale, value, what)


def text_seconds(text: str, what: str, scale: float = 1.0) -> float:
    """A time written as text (a CSV field): a finite number, in seconds after `scale`."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise FieldError(f"{what} {str(text).strip()[:40]!r} is not a number") from None
    return _finite(v * scale, str(text).strip()[:40], what)


def _finite(v: float, shown, what: str) -> float:
    if not math.isfinite(v):
        raise FieldError(f"{what} {shown!r} is not finite")
    return v


def flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"{what} must be true or false, got {_show(value)}")
    return value


def request_id(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FieldError(f"id must be a string or a whole number, got {_show(value)}")
    text = str(value)
    if not text or len(text) > MAX_ID_CHARS:
        raise FieldError(f"id must be 1 to {MAX_ID_CHARS} characters, got {len(text)}")
    return text


MAX_CLASS_CHARS = 64
CLASS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")


def class_name(value) -> str:
    """A priority class: 1 to 64 letters, digits, `_`, `-` or `.` (it appears in labels, tables and
    `--class-slo CLASS:ttft=MS`, so no separators, spaces or control characters)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise FieldError(f"class must be a name (letters, digits, _ - .), got {_show(value)}")
    text = str(value)
    if not 1 <= len(text) <= MAX_CLASS_CHARS or not set(text) <= CLASS_CHARS:
        raise FieldError(f"class {text[:40]!r} must be 1 to {MAX_CLASS_CHARS} letters, digits, _ - or .")
    return text


def text_class(text: str) -> str | None:
    """A class written as text (a CSV field); an empty field is no class."""
    text = text.strip()
    return class_name(text) if text else None


def target_ms(value, what: str) -> float:
    """A JSON latency target: a finite number of milliseconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(f"{what} must be a number of milliseconds, got {_show(value)}")
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise FieldError(f"{what} must be a finite number of milliseconds > 0, got {_show(value)}")
    return v


def text_target_ms(text: str, what: str) -> float | None:
    """A latency target written as text (a CSV field); an empty field is no target."""
    text = text.strip()
    if not text:
        return None
    try:
        v = float(text)
    except ValueError:
        raise FieldError(f"{what} {text[:40]!r} is not a number of milliseconds") from None
    return target_ms(v, what)


def whole_numbers(value, what: str, lo: int = 0, hi: int = (1 << 63) - 1) -> tuple[int, ...]:
    """A list of whole numbers in [lo, hi] (prompt token ids, prefix-block hashes)."""
    if not isinstance(value, list):
        raise FieldError(f"{what} must be a list of whole numbers, got {_show(value)}")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise FieldError(f"{what} must be whole numbers in [{lo}, {hi}], got {_show(x)}")
    return tuple(value)


def _show(value) -> str:
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'list'}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"  # as JSON writes it
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
