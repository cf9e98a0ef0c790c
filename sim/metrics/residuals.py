"""Every call of a measured run priced by a cost model: where a prediction misses, call by call.

Run-level metrics average misses away; a max gap sits where one join or one unaligned chunk lands.
So a calibration's engine replay and every confirm report keep predicted/measured per call, summed
up by call kind and size bucket (median and p90 of the ratio), which says where a miss is. A real
run also counts each call's page faults (`EventLog.faults`), so a row says how many of its calls
met fresh memory and what they ran at: a join faulting 160 MB ran 0.49 s where its copy is priced at 63 ms,
and a median over joins would hide it.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from sim.cost.model import CostModel
from sim.cost.price import price
from sim.engine.log import Call, EventLog
from sim.engine.pipeline import logged_returns

FAULTED = 256  # minor faults (1 MiB of 4 KiB pages) from which a call counts as having met fresh memory
TILE = 16  # a chunk of a multiple of this many rows runs the BLAS's fast kernels (see calibrate/measure/grid.py)
KINDS = ("prefill", "decode", "single", "join", "leave", "grow", "prompt", "first", "generate", "merge", "mixed")


def call_kind(c: Call) -> str:
    """prefill; decode (a steady batch step); single (a request on its own cache); join or leave
    (the batch cache rebuilt: a sync call, or a decode of a log from before syncs were calls);
    grow (a step whose buffer grew, a single decode's own cache too: a copy). mlx-lm's calls:
    prompt, first, generate, and merge (a generation step that pays the batch's lazy rebuild:
    rows joined or left since the last step, or its buffer grew)."""
    if c.kind == "prefill":
        return "prefill"
    if c.kind in ("prompt", "first", "mixed"):
        return c.kind
    if c.kind == "generate":
        return "merge" if c.written else "generate"
    if not c.batched:
        return "grow" if c.written else "single"
    if c.joined:
        return "join"
    if c.left:
        return "leave"
    return "grow" if c.written else "decode"


def size_bucket(kind: str, tokens: int, rows: int = 1) -> str:
    """Prefill: chunk length range and whether it is a multiple of TILE; decode: batch size;
    mlx-lm's prompt call: the (padded) chunk length as a prefill's, with `rows` rows; a mixed
    forward: its rows and its tokens as a prefill's."""
    if kind == "prompt":
        return f"{rows}x " + size_bucket("prefill", tokens)
    if kind == "mixed":
        return f"{rows} rows " + size_bucket("prefill", tokens)
    if kind != "prefill":
        return f"batch {tokens}"
    lo = 1
    for hi in (16, 64, 256, 1024, 1 << 30):
        if tokens < hi:
            break
        lo = hi
    span = f"{lo}-{hi - 1}" if hi < 1 << 30 else f"{lo}+"
    return f"{span} {'aligned' if tokens % TILE == 0 else 'unaligned'}"


def price_call(cost: CostModel, c: Call) -> float:
    """Seconds the cost model gives a logged call, from its logged shape alone."""
    return price(cost, c.kind, c.tokens, c.prefix, c.contexts, c.batched, c.joined, c.left, c.written, c.fresh,
                 c.chunks)


def timed_calls(log: EventLog) -> Iterator[tuple[Call, int | None]]:
    """Each call of the log that ran for a measurable time (a preemption runs no kernel), with its
    page faults (None: the run did not count them)."""
    faults = log.faults if log.faults is not None else [None] * log.call_count
    for c, n in zip(log.calls, faults):
        if c.end > c.start and c.kind != "preempt":
            yield c, n


def priced_calls(log: EventLog, cost: CostModel) -> Iterator[tuple[Call, int | None, float]]:
    """`timed_calls` with each one's predicted seconds: its price, or in a run that pipelined mlx-lm's
    next() (`EventLog.pipelined`), the host span `sim.engine.pipeline` gives it from its measured
    start, with the device's queue as the model ran it: what the replay would have logged."""
    pipe = cost.pipeline("mlx-lm") if log.pipelined else None
    if pipe is None:
        for c, n in timed_calls(log):
            yield c, n, price_call(cost, c)
        return
    faults = log.faults if log.faults is not None else [None] * log.call_count
    calls, outputs = log.calls, {r: q.output_len for r, q in log.requests.items()}
    returns = logged_returns(pipe, calls, (price_call(cost, c) for c in calls), outputs)
    for c, n, back in zip(calls, faults, returns):
        if c.end > c.start:
            yield c, n, back - c.start


def call_ratios(logs: list[EventLog], cost: CostModel) -> list[tuple[str, str, float]]:
    """(kind, size bucket, predicted/measured) for every call of every log."""
    return [(call_kind(c), size_bucket(c.kind, c.tokens, len(c.rids)), p / (c.end - c.start))
            for log in logs for c, _, p in priced_calls(log, cost)]


def residual_table(logs: list[EventLog], cost: CostModel, by_size: bool = True) -> list[dict]:
    """One row per call kind (and size bucket): calls, median and p90 of predicted/measured, the
    median |relative error|; where the runs counted page faults, how many calls faulted `FAULTED`
    pages or more and their median predicted/measured (None: none did), and where the cost
    model knows a KV token's bytes, the token-rows of fresh memory `sim.engine.heap` gave the calls
    against the rows they faulted, with the sum of the calls' |difference|: the heap model's miss
    by call kind, which a time ratio mixes with every other price."""
    rows = summarize(call_ratios(logs, cost), by_size)
    counted = [log for log in logs if log.faults is not None]
    if counted:
        row_bytes = cost.kv_bytes
        faulted: dict[tuple[str, str], list[float]] = {}
        fresh: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for log in counted:
            for c, n, p in priced_calls(log, cost):
                key = (call_kind(c), size_bucket(c.kind, c.tokens, len(c.rids)) if by_size else "all")
                if n >= FAULTED:
                    faulted.setdefault(key, []).append(p / (c.end - c.start))
                if row_bytes:
                    fresh.setdefault(key, []).append((c.fresh, n * log.fault_bytes / row_bytes))
        for row in rows:
            key = (row["kind"], row["size"])
            rs = faulted.get(key, [])
            row["faulted"] = len(rs)
            row["faulted_ratio_median"] = float(np.median(rs)) if rs else None
            if row_bytes:
                pairs = fresh.get(key, [])
                row["fresh_rows"] = sum(p for p, _ in pairs)
                row["faulted_rows"] = float(sum(f for _, f in pairs))
                row["fresh_rows_error"] = float(sum(abs(p - f) for p, f in pairs))
    return rows


def summarize(ratios: list[tuple[str, str, float]], by_size: bool = True) -> list[dict]:
    """(kind, bucket, predicted/measured) triples as table rows, by kind (and bucket)."""
    groups: dict[tuple[str, str], list[float]] = {}
    for kind, bucket, r in ratios:
        groups.setdefault((kind, bucket if by_size else "all"), []).append(r)
    rows = []
    for (kind, bucket), rs in sorted(groups.items(), key=lambda kv: (KINDS.index(kv[0][0]), kv[0][1])):
        a = np.asarray(rs)
        rows.append({"kind": kind, "size": bucket, "calls": len(a), "ratio_median": float(np.median(a)),
                     "ratio_p90": float(np.quantile(a, 0.9)), "ratio_p10": float(np.quantile(a, 0.1)),
                     "abs_error_median": float(np.median(np.abs(a - 1)))})
    return rows


STRETCH = 15  # calls in a row whose median sets a stretch apart from its run
OFF = 0.10  # how far from the run's own pace (the DISTURBED bound of `sim.cost.noise`)


def off_stretches(log: EventLog, cost: CostModel, calls: int = STRETCH, off: float = OFF) -> list[dict]:
    """Where a measured run's calls ran away from the run's own pace (predicted/measured over all its
    calls' median) by `off` or more, over `calls` calls in a row or more: each stretch's start and
    end (seconds), calls, median ratio against the run's, and that by call kind. Every kind off
    alike is the host: a shared VM slows for 20-60 s at a time, which the speed probes around a run
    do not see, and a run's tails land where it did. One kind off alone is its price."""
    priced = [(c, p / (c.end - c.start)) for c, _, p in priced_calls(log, cost)]
    if len(priced) < 2 * calls:
        return []
    pace = float(np.median([r for _, r in priced]))
    rel = np.array([r for _, r in priced]) / pace
    window = np.median(np.lib.stride_tricks.sliding_window_view(rel, calls), axis=1)  # window i: calls i..i+calls-1
    out, i = [], 0
    while i < len(window):
        if abs(window[i] - 1) < off:
            i += 1
            continue
        j, slow = i, window[i] < 1
        while j + 1 < len(window) and abs(window[j + 1] - 1) >= off and (window[j + 1] < 1) == slow:
            j += 1
        lo, hi = i + calls // 2, j + calls // 2 + 1  # the flagged windows' middle calls
        part = priced[lo:hi]
        kinds: dict[str, list[float]] = {}
        for c, r in part:
            kinds.setdefault(call_kind(c), []).append(r / pace)
        out.append({"start_s": part[0][0].start, "end_s": part[-1][0].end, "calls": len(part),
                    "ratio": float(np.median(rel[lo:hi])),
                    "by_kind": {k: float(np.median(v)) for k, v in kinds.items()}})
        i = j + 1
    return out
