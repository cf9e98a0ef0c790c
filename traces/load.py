"""Resolve a `--trace` argument: a built-in generator name or a file in a supported format."""
from __future__ import annotations

import inspect
import os
from pathlib import Path

from sim.core.inputs import check_file
from traces.formats import FORMATS, PDSIM, detect, format_name, read
from traces.generators import GENERATORS
from traces.shape import Shaping, apply
from traces.trace import Trace, TraceError, load_jsonl


def load_file(path: str | Path, fmt: str | None = None, shaping: Shaping | None = None, **options) -> Trace:
    """Read a trace file in any supported format, detected from its first line unless `fmt` names it.

    `options` go to the format's loader (`model`/`log_type` for BurstGPT; `arrivals`, `rate`,
    `burstiness`, `seed` for length-only CSVs); None values are ignored. `shaping` is applied after
    loading, with its window and first-N passed down to the reader so a large file is read only
    as far as needed; the result equals shaping the fully loaded trace (only the `rows_read` and
    `read_to_end` figures in the metadata tell the difference).
    """
    path = check_file(path, "trace", TraceError)
    if path.stat().st_size == 0:
        raise TraceError(f"trace {path}: empty file")
    name = format_name(fmt) if fmt else detect(path)
    options = {k: v for k, v in options.items() if v is not None}
    if name == PDSIM:
        extra = sorted(set(options) - {"seed"})
        if extra:
            raise TraceError(f"{path}: option(s) {', '.join(extra)} do not apply to a pdsim JSONL trace")
        return apply(load_jsonl(path), shaping)
    start, end, limit = 0.0, None, None
    if shaping is not None:
        if shaping.window is not None:
            start, end = shaping.window
        if shaping.first is not None:
            limit = shaping.first
    requests, meta = read(path, name, start=start, end=end, limit=limit, **options)
    return apply(Trace(requests, meta), shaping)


_NOT_OPTIONS = {"vocab", "source"}  # generator parameters that are not a trace's options


def accepted_options(spec: str, fmt: str | None = None) -> tuple[str, ...]:
    """The options a `--trace` value takes: a generator's parameters, or a file format's loader
    options (`seed` only where the format draws arrivals); anything else given would be ignored."""
    if spec in GENERATORS:
        return tuple(n for n in inspect.signature(GENERATORS[spec]).parameters if n not in _NOT_OPTIONS)
    _exists(spec)
    check_file(spec, "trace", TraceError)
    name = format_name(fmt) if fmt else detect(spec)
    if name == PDSIM:
        return ()
    options = FORMATS[name].options
    return options + (("seed",) if "rate" in options else ())


def resolve(spec: str, fmt: str | None = None, shaping: Shaping | None = None, **options) -> Trace:
    """A generator by name (with its options) or a trace file (with its loader options), then shaped.

    An option the generator or the file's format does not take is refused (TraceError), never
    ignored; None values count as not given."""
    options = {k: v for k, v in options.items() if v is not None}
    if spec in GENERATORS:
        if fmt:
            raise TraceError(f"trace {spec!r} is a generator; a format applies only to files")
        takes = accepted_options(spec)
        extra = sorted(set(options) - set(takes))
        if extra:
            raise TraceError(f"trace {spec!r}: option(s) {', '.join(extra)} do not apply to the {spec} generator "
                             f"(it takes {', '.join(takes)})")
        return apply(GENERATORS[spec](**options), shaping)
    _exists(spec)
    return load_file(spec, fmt, shaping, **options)


def _exists(spec: str) -> None:
    """A `--trace` value that names neither a generator nor anything on disk (`check_file` then
    says what is wrong with a path that does exist: a folder, a FIFO, a file it may not read)."""
    try:
        os.lstat(spec)
    except PermissionError:
        return  # `check_file` says so
    except OSError:
        raise TraceError(f"trace {spec!r}: neither a file nor a generator ({', '.join(GENERATORS)})") from None
