"""Workload shaping: cut, sample, speed up and cap a trace to fit a machine's capacity.

Each function returns a new `Trace` and appends one entry to `meta["shaping"]`, so a result
carries exactly what was replayed: the source, then every cut and scale in the order applied.
`apply` runs a `Shaping` in a fixed order: window, first N, sample, speed, prompt cap, output cap.
The entries hold the parameters (and what sampling or capping changed), not counts a reader could
skip: `load_file` reads only as far as a window and first N need, and must record the same steps.

Functions that drop requests from the front (window, sample) shift the arrivals so the first kept
request arrives at 0.0, as every loader does, and record that shift as `offset_s`: a replay does
not begin with idle time the source happened to have before the cut.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from traces.trace import Request, Trace, TraceError


@dataclass(frozen=True)
class Shaping:
    """What to do to a trace; None leaves that step out."""
    window: tuple[float, float | None] | None = None  # [start, end) seconds; end None = to the end
    first: int | None = None
    sample: int | None = None
    seed: int = 0  # for sample
    speed: float | None = None
    max_prompt: int | None = None
    max_output: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None:
            check_window(*self.window)
        for name in ("first", "sample", "max_prompt", "max_output"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, np.integer)) or v < 1):
                raise TraceError(f"{name.replace('_', ' ')} must be a whole number >= 1, got {v!r}")
        if self.speed is not None and not (math.isfinite(self.speed) and self.speed > 0):
            raise TraceError(f"speed must be a finite number > 0, got {self.speed}")

    def is_empty(self) -> bool:
        return all(v is None for k, v in asdict(self).items() if k != "seed")


def check_window(start: float, end: float | None) -> None:
    if not (math.isfinite(start) and start >= 0):
        raise TraceError(f"window start must be >= 0 seconds, got {start}")
    if end is not None and not end > start:
        raise TraceError(f"window end must be after its start, got {start}:{end}")


def parse_window(text: str) -> tuple[float, float | None]:
    """`START:END` in seconds; either side may be empty (`:600` is the first 10 minutes)."""
    head, sep, tail = text.partition(":")
    if not sep:
        raise TraceError(f"window {text!r}: expected START:END in seconds, e.g. 0:3600")
    try:
        start = float(head) if head.strip() else 0.0
        end = float(tail) if tail.strip() else None
    except ValueError:
        raise TraceError(f"window {text!r}: START and END must be numbers of seconds") from None
    check_window(start, end)
    return start, end


def apply(trace: Trace, shaping: Shaping | None) -> Trace:
    """Every step `shaping` names, in the fixed order window, first, sample, speed, caps."""
    if shaping is None:
        return trace
    if shaping.window is not None:
        trace = window(trace, *shaping.window)
    if shaping.first is not None:
        trace = first(trace, shaping.first)
    if shaping.sample is not None:
        trace = sample(trace, shaping.sample, shaping.seed)
    if shaping.speed is not None:
        trace = speed(trace, shaping.speed)
    if shaping.max_prompt is not None:
        trace = max_prompt(trace, shaping.max_prompt)
    if shaping.max_output is not None:
        trace = max_output(trace, shaping.max_output)
    return trace


def window(trace: Trace, start: float, end: float | None = None) -> Trace:
    """The requests arriving in [start, end) seconds, shifted so the first of them arrives at 0."""
    check_window(start, end)
    kept = [r for r in trace.requests if r.arrival >= start and (end is None or r.arrival < end)]
    if not kept:
        span = f"0 to {trace.requests[-1].arrival:g} s" if trace.requests else "nothing"
        raise TraceError(f"trace {trace.meta.get('source', '')}: window {start:g}:{'' if end is None else f'{end:g}'} "
                         f"holds no requests (the trace spans {span})")
    kept, offset = _rebase(kept)
    return _derive(trace, kept, {"op": "window", "start_s": start, "end_s": end, "offset_s": offset})


def first(trace: Trace, n: int) -> Trace:
    """The first `n` requests (all of them if the trace is shorter)."""
    _check_count("first", n)
    kept = trace.requests[:n]
    return _derive(trace, kept, {"op": "first", "n": n})


def sample(trace: Trace, n: int, seed: int = 0) -> Trace:
    """`n` requests drawn uniformly without replacement, kept in arrival order.

    Thinning a trace this way keeps its shape over time (bursts stay bursts) at a lower rate;
    `first` and `window` keep the rate and shorten the time instead.
    """
    _check_count("sample", n)
    if n >= len(trace):
        kept = list(trace.requests)
    else:
        idx = np.sort(np.random.default_rng(seed).choice(len(trace), size=n, replace=False))
        kept = [trace.requests[i] for i in idx]
    kept, offset = _rebase(kept)
    return _derive(trace, kept, {"op": "sample", "n": n, "seed": seed, "kept": len(kept), "offset_s": offset})


def speed(trace: Trace, factor: float) -> Trace:
    """Replay `factor` times as fast: every arrival time divided by `factor` (2 = twice the rate)."""
    if not (math.isfinite(factor) and factor > 0):
        raise TraceError(f"speed must be a finite number > 0, got {factor}")
    kept = [_with(r, arrival=r.arrival / factor) for r in trace.requests]
    return _derive(trace, kept, {"op": "speed", "factor": factor})


def max_prompt(trace: Trace, cap: int) -> Trace:
    """Cut prompts longer than `cap` tokens to `cap` (a model's maximum context, say).

    Prompt token ids are cut to match; prefix-block hashes keep only the blocks the cut prompt
    still touches (`meta["block_tokens"]` tokens per block).
    """
    _check_count("max prompt", cap)
    block = trace.meta.get("block_tokens")
    n = 0
    kept = []
    for r in trace.requests:
        if r.prompt_len > cap:
            n += 1
            ids = None if r.prompt_ids is None else r.prompt_ids[:cap]
            hashes = r.hash_ids
            if hashes is not None and block:
                hashes = hashes[:math.ceil(cap / block)]
            r = _with(r, prompt_len=cap, prompt_ids=ids, hash_ids=hashes)
        kept.append(r)
    return _derive(trace, kept, {"op": "max_prompt", "cap": cap, "clamped": n})


def max_output(trace: Trace, cap: int) -> Trace:
    """Cut output budgets longer than `cap` tokens to `cap`."""
    _check_count("max output", cap)
    n = sum(r.output_len > cap for r in trace.requests)
    kept = [_with(r, output_len=cap) if r.output_len > cap else r for r in trace.requests]
    return _derive(trace, kept, {"op": "max_output", "cap": cap, "clamped": n})


def _check_count(what: str, n: int) -> None:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise TraceError(f"{what} must be a whole number >= 1, got {n!r}")


def _rebase(kept: list[Request]) -> tuple[list[Request], float]:
    """Shift `kept` so its first request arrives at 0.0; return the shift in seconds."""
    offset = kept[0].arrival if kept else 0.0
    if offset == 0:
        return kept, 0.0
    return [_with(r, arrival=r.arrival - offset) for r in kept], offset


def _with(r: Request, **changes) -> Request:
    """A copy of `r` with some fields changed (the direct call is several times faster than replace)."""
    d = {"id": r.id, "arrival": r.arrival, "prompt_len": r.prompt_len, "output_len": r.output_len,
         "prompt_ids": r.prompt_ids, "hash_ids": r.hash_ids, "prefilled": r.prefilled, "cls": r.cls,
         "ttft_slo_ms": r.ttft_slo_ms}
    d.update(changes)
    return Request(**d)


def _derive(trace: Trace, requests: list[Request], step: dict) -> Trace:
    meta = dict(trace.meta)
    meta["shaping"] = list(trace.meta.get("shaping", [])) + [step]
    return Trace(requests, meta)
