"""The one metrics module: scores any event log, simulated or measured, by the seeds' definitions.

Each metric's name, unit, definition and direction are in `sim.metrics.registry`; `score` returns
exactly the registry's names, in its order, whatever the run (NaN where a run cannot measure one).

- decode-completion gap (tiny-llm): time between consecutive completed decode calls; an iteration
  that runs no decode resets it (tiny-llm's `benches/bench.py`), and so does idle time waiting for
  an arrival. Nearest-rank percentiles, `sorted[ceil(q*n)-1]` (numpy's `inverted_cdf`): p50 is the
  lower middle of an even count, where tiny-llm's `statistics.median` averages the two middles
  (`decode_gap_median_ms`).
- inter-token gaps (meTile, vLLM's ITL): successive differences of each request's emission times,
  pooled over requests; linear-interpolation percentiles; initial resumption gap: the gap of an
  already-decoding request that spans a new arrival; stalls: gaps above a threshold, their count
  and summed excess.
- TTFT, TPOT, E2E latency, makespan, throughput, goodput: vLLM's serving-benchmark conventions
  (mean, median, population std, linear percentiles; completed requests only).
- busy fraction: time in engine calls over the makespan; near 1, arrivals outpace the engine.

`score` runs a whole log through a `sim.metrics.tally.Tally`, the same code that scores a long replay as
it goes (`sim.metrics.scored_log`), so a log in memory and a replay that never kept one are scored alike.
The functions below state each definition on a whole log; the tests hold the tally to them.
"""
from __future__ import annotations

import math
from itertools import chain

import numpy as np

from sim.core.errors import InputError
from sim.engine.log import EventLog
from sim.metrics.tally import RequestTable, Slo, Tally

SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2el"}


def nearest_rank(values, q: float) -> float:
    """`sorted[ceil(q*n)-1]`, the percentile tiny-llm reports: numpy's `inverted_cdf` method."""
    v = np.asarray(values, float)
    return float(np.percentile(v, q * 100, method="inverted_cdf")) if len(v) else math.nan


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q * 100)) if len(values) else math.nan


def _stats(values: np.ndarray, prefix: str, suffix: str, out: dict) -> None:
    """vLLM's summary of one latency list: mean, median, std (population), p50, p95, p99."""
    n = len(values)
    out[f"mean_{prefix}{suffix}"] = float(values.mean()) if n else math.nan
    out[f"median_{prefix}{suffix}"] = float(np.median(values)) if n else math.nan
    out[f"std_{prefix}{suffix}"] = float(values.std()) if n else math.nan
    for q in (50, 95, 99):
        out[f"p{q}_{prefix}{suffix}"] = _pct(values, q / 100)


def decode_gaps(log: EventLog) -> np.ndarray:
    """Decode-completion gaps in seconds, by tiny-llm's rule (`benches/bench.py`): between
    consecutive decode calls, unless an iteration that ran no decode lies between them (tiny-llm
    resets its clock there), or the engine sat idle waiting for an arrival (every request that
    had arrived had finished: idle time is no request's wait)."""
    ends, its = log.decode_ends()
    if len(ends) < 2:
        return np.zeros(0)
    order = np.argsort(ends, kind="stable")
    ends, its = ends[order], its[order]
    prev = ends[:-1]
    arrivals = np.sort([r.arrival for r in log.requests.values()])
    finished = np.sort([t[-1] for t in log.tokens.values() if t])
    busy = np.searchsorted(arrivals, prev, "right") > np.searchsorted(finished, prev, "right")
    return (ends[1:] - prev)[(np.diff(its) <= 1) & busy]


def inter_token_gaps(log: EventLog) -> np.ndarray:
    """Every request's successive emission-time differences, pooled, in seconds."""
    lengths = np.fromiter(map(len, log.tokens.values()), int, len(log.tokens))
    times = np.fromiter(chain.from_iterable(log.tokens.values()), float, int(lengths.sum()))
    gaps = np.diff(times)
    ends = np.cumsum(lengths)  # one past each request's last emission
    within = np.ones(len(gaps), bool)  # drop the differences from one request's list to the next
    within[ends[(ends > 0) & (ends < len(times))] - 1] = False
    return gaps[within]


def latency_rows(log: EventLog) -> list[dict]:
    """Per-request TTFT, TPOT and E2E latency in seconds (None where undefined); plain Python, fast."""
    rows = []
    for rid, info in log.requests.items():
        t = log.tokens.get(rid, ())
        n = len(t)
        rows.append({"id": rid, "arrival": info.arrival, "prompt_len": info.prompt_len,
                     "output_len": info.output_len, "generated": n, "prefilled": info.prefilled,
                     "ttft": t[0] - info.arrival if n and not info.prefilled else None,
                     "e2el": t[-1] - info.arrival if n else None,
                     "tpot": (t[-1] - t[0]) / (n - 1) if n > 1 else None})
    return rows


def request_rows(log: EventLog) -> list[dict]:
    """Per-request figures: TTFT, TPOT, E2E latency and inter-token gap statistics (seconds)."""
    rows = latency_rows(log)
    for row in rows:
        gaps = np.diff(np.asarray(log.tokens.get(row["id"], ()), float))
        row["gap_max"] = float(gaps.max()) if len(gaps) else None
        row["gap_p95"] = _pct(gaps, 0.95) if len(gaps) else None
    return rows


def resumption_gaps(log: EventLog) -> list[tuple[str, str, float]]:
    """(decoding request, arriving request, gap): the gap of each decoding request spanning an arrival.

    The definition, pair by pair (quadratic in requests); `resumption_summary` computes what
    `score` reports from it for traces of any size."""
    out = []
    for rid_b, info_b in log.requests.items():
        ta = info_b.arrival
        for rid, t in log.tokens.items():
            if rid == rid_b or len(t) < 2 or not (t[0] <= ta < t[-1]):
                continue
            i = int(np.searchsorted(t, ta, "right"))  # first emission after the arrival
            out.append((rid, rid_b, t[i] - t[i - 1]))
    return out


def resumption_summary(log: EventLog) -> tuple[float, float]:
    """(max, mean) of `resumption_gaps` in seconds, NaN if there are none, for traces of any size:
    the (decoding request, arrival) pairs found by binary search over the sorted arrivals, then
    each pair's first emission after the arrival by a vectorized bisection inside its request's
    emissions, so the cost follows the pairs that exist, not all requests times all arrivals."""
    rids = list(log.tokens)
    lengths = np.fromiter(map(len, log.tokens.values()), int, len(rids))
    times = np.fromiter(chain.from_iterable(log.tokens.values()), float, int(lengths.sum()))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    infos = sorted(log.requests.values(), key=lambda i: i.arrival)
    arrivals = np.fromiter((i.arrival for i in infos), float, len(infos))
    index = {rid: k for k, rid in enumerate(rids)}
    owner = np.fromiter((index.get(i.rid, -1) for i in infos), int, len(infos))
    decoding = np.flatnonzero(lengths >= 2)
    lo = np.searchsorted(arrivals, times[starts[decoding]], "left")  # arrivals in [first, last) emission
    hi = np.searchsorted(arrivals, times[ends[decoding] - 1], "left")
    counts = np.maximum(hi - lo, 0)
    req = np.repeat(decoding, counts)
    arr = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - lo, counts)
    other = owner[arr] != req  # a request's own arrival is not a resumption
    req, a = req[other], arrivals[arr[other]]
    if not len(a):
        return math.nan, math.nan
    left, right = starts[req], ends[req]  # the first emission later than `a`, in the request's own
    while (active := left < right).any():
        mid = (left + right) // 2
        later = times[np.minimum(mid, len(times) - 1)] > a
        left = np.where(active & ~later, mid + 1, left)
        right = np.where(active & later, mid, right)
    gaps = times[left] - times[left - 1]
    return float(gaps.max()), float(gaps.mean())


def score(log: EventLog, slo: Slo | None = None, stall_ms: float = 100.0) -> dict:
    """Every metric of the run, as a flat dict in the registry's order (times in ms unless the key
    says otherwise; NaN where the run cannot measure one, e.g. goodput without a target). Exact:
    the log is in memory already, so no distribution is folded into a sketch."""
    return tally_of(log, slo, stall_ms).result()


def tally_of(log: EventLog, slo: Slo | None = None, stall_ms: float = 100.0, keep_rows: bool = False) -> Tally:
    """A whole log through a `Tally`: requests in the log's order, decode calls by end time."""
    infos = list(log.requests.values())
    tally = Tally(RequestTable.of(infos), slo, stall_ms, cap=1 << 62, keep_rows=keep_rows)
    for i, info in enumerate(infos):
        tally.request_done(i, log.tokens.get(info.rid, ()))
    ends, its = log.decode_ends()
    order = np.argsort(ends, kind="stable")
    tally.decode_calls(ends[order], its[order])
    tally.engine_calls(log.call_count, log.busy_seconds())
    tally.peak_memory = getattr(log, "peak_memory", None)
    tally.preemptions(*log.preemptions())
    return tally


# Per-class figures (`class_metrics`): a section of their own beside the registry's flat metrics,
# so a sweep's columns stay the same whatever classes a trace holds.
CLASS_FIGURES = ("requests", "completed", "ttft_target_ms", "mean_ttft_ms", "p50_ttft_ms", "p95_ttft_ms",
                 "p99_ttft_ms", "max_ttft_ms", "slo_attained")
CLASS_SHOWN = ("requests", "completed", "ttft_target_ms", "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
               "slo_attained")  # `pdsim simulate`'s table
CLASS_CONFIRMED = ("p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "slo_attained")  # confirm: predicted vs measured


def class_metrics(requests, ttft_s, generated) -> dict[str, dict] | None:
    """TTFT by priority class (`Request.cls`), in ms, by the registry's TTFT conventions (completed
    requests; linear-interpolation percentiles), and each class's SLO attainment: the share of all
    its requests that carry a target (`Request.ttft_slo_ms`) whose TTFT met it (an unfinished
    request misses it). `ttft_target_ms` is the class's target when its requests share one. None for a
    trace without classes; NaN (null in JSON) where a class has no completed request or no target."""
    reqs = list(requests)
    if not any(r.cls is not None for r in reqs):
        return None
    ttft, gen = np.asarray(ttft_s, float), np.asarray(generated)
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r.cls for r in reqs):
        idx = [i for i, r in enumerate(reqs) if r.cls == name]
        done = np.array([gen[i] == reqs[i].output_len and not np.isnan(ttft[i]) for i in idx], bool)
        ms = ttft[idx][done] * 1e3
        targets = [reqs[i].ttft_slo_ms for i in idx]
        have = [t is not None for t in targets]
        met = sum(d and t is not None and v * 1e3 <= t for d, t, v in zip(done, targets, ttft[idx]))
        shared = set(targets)
        out["-" if name is None else name] = {
            "requests": len(idx), "completed": int(done.sum()),
            "ttft_target_ms": targets[0] if len(shared) == 1 and targets[0] is not None else math.nan,
            "mean_ttft_ms": float(ms.mean()) if len(ms) else math.nan,
            **{f"p{q}_ttft_ms": _pct(ms, q / 100) for q in (50, 95, 99)},
            "max_ttft_ms": float(ms.max()) if len(ms) else math.nan,
            "slo_attained": met / sum(have) if any(have) else math.nan}
    return out


def log_class_metrics(trace, log: EventLog) -> dict[str, dict] | None:
    """`class_metrics` of a run's event log (a request without a class is class `-`)."""
    if not any(r.cls is not None for r in trace.requests):
        return None
    ttft, gen = [], []
    for r in trace.requests:
        t = log.tokens.get(r.id, ())
        gen.append(len(t))
        ttft.append(t[0] - r.arrival if t and not r.prefilled else math.nan)
    return class_metrics(trace.requests, ttft, gen)


def parse_slo(items: list[str]) -> Slo:
    """`["ttft:2000", "tpot:100"]` -> Slo; InputError naming the bad item."""
    kw = {}
    for item in items:
        key, _, val = item.partition(":")
        if key not in SLO_KEYS or not val:
            raise InputError(f"--slo {item!r}: expected KEY:MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            kw[key] = float(val)
        except ValueError:
            raise InputError(f"--slo {item!r}: {val!r} is not a number of milliseconds") from None
        if not (math.isfinite(kw[key]) and kw[key] > 0):
            raise InputError(f"--slo {item!r}: a target must be a finite number > 0 ms")
    return Slo(**kw)
