"""Priority classes: each request may carry a class, and each class a TTFT target.

A trace names a request's class in an optional `class` column (field) in every format, and may
give the request its own TTFT target (`ttft_slo_ms`). `--class-slo CLASS:ttft=MS` gives every
request of a class that target, where the trace enters (`sim.commands.common.traces_from_args`):
the targets then travel in the trace itself, so its SHA-256 covers them, a confirm's fresh
processes read them, and `queue=priority` (earliest deadline first, `policies.queue`) and the
per-class metrics (`sim.classes`) read the same numbers. A class with no target is allowed: its
requests have no deadline.
"""
from __future__ import annotations

import math

from traces import schema
from traces.shape import _derive, _with
from traces.trace import Trace, TraceError

TARGET_KEYS = ("ttft",)


def parse_class_slo(items: list[str]) -> dict[str, float]:
    """`["tight:ttft=500", "bulk:ttft=20000"]` -> {class: TTFT ms}; TraceError naming the bad item."""
    out: dict[str, float] = {}
    for item in items:
        name, colon, rest = item.partition(":")
        key, eq, val = rest.partition("=")
        if not colon or not eq or key.strip() not in TARGET_KEYS:
            raise TraceError(f"--class-slo {item!r}: expected CLASS:ttft=MS (e.g. tight:ttft=500)")
        try:
            name = schema.class_name(name.strip())
        except schema.FieldError as e:
            raise TraceError(f"--class-slo {item!r}: {e}") from None
        try:
            ms = float(val)
        except ValueError:
            raise TraceError(f"--class-slo {item!r}: {val!r} is not a number of milliseconds") from None
        if not (math.isfinite(ms) and ms > 0):
            raise TraceError(f"--class-slo {item!r}: a target must be a finite number > 0 ms")
        if name in out and out[name] != ms:
            raise TraceError(f"--class-slo {item!r}: class {name!r} is given two targets")
        out[name] = ms
    return out


def classes(trace: Trace) -> list[str]:
    """The trace's classes, in order of first appearance (empty: a trace without classes)."""
    return list(dict.fromkeys(r.cls for r in trace.requests if r.cls is not None))


def with_class_targets(traces: dict[str, Trace], targets: dict[str, float]) -> dict[str, Trace]:
    """Each trace with every request of each class given its class's TTFT target (replacing any
    the trace had); a class that no trace holds is refused (a misspelt name would set nothing)."""
    if not targets:
        return traces
    have = {name: classes(t) for name, t in traces.items()}
    known = list(dict.fromkeys(c for cs in have.values() for c in cs))
    missing = [c for c in targets if c not in known]
    if missing:
        sources = ", ".join(str(t.meta.get("source", name)) for name, t in traces.items())
        raise TraceError(f"--class-slo {missing[0]}: trace {sources} has no request of class {missing[0]!r} "
                         f"(classes: {', '.join(known) or 'none: the trace has no class column'})")
    out = {}
    for name, trace in traces.items():
        mine = {c: ms for c, ms in targets.items() if c in have[name]}
        reqs = [_with(r, ttft_slo_ms=mine[r.cls]) if r.cls in mine else r for r in trace.requests]
        out[name] = _derive(trace, reqs, {"class_slo": mine}) if mine else trace
    return out
