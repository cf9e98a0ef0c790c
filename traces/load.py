"""Resolve a `--trace` argument: a built-in generator name or a file in a supported format."""
from __future__ import annotations

from pathlib import Path

from traces.generators import GENERATORS
from traces.trace import Trace, TraceError, load_jsonl


def load_file(path: str | Path) -> Trace:
    """Read a trace file; the format is detected from its name and first line."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace {path}: no such file")
    if path.stat().st_size == 0:
        raise TraceError(f"trace {path}: empty file")
    return load_jsonl(path)


def resolve(spec: str, **gen_options) -> Trace:
    """A generator by name (with its options) or a trace file."""
    if spec in GENERATORS:
        return GENERATORS[spec](**{k: v for k, v in gen_options.items() if v is not None})
    if not Path(spec).exists():
        raise TraceError(f"trace {spec!r}: neither a file nor a generator ({', '.join(GENERATORS)})")
    return load_file(spec)
