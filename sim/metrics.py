"""The one metrics module: scores any event log, simulated or measured, by the seeds' definitions.

- decode-completion gap (tiny-llm): time between consecutive completed decode calls; an iteration
  that runs no decode resets it (tiny-llm's `benches/bench.py`), and so does idle time waiting for
  an arrival. Nearest-rank percentiles, `sorted[ceil(q*n)-1]`: p50 is the lower middle of an even
  count, where tiny-llm's `statistics.median` averages the two middles (`decode_gap_median_ms`).
- inter-token gaps (meTile): successive differences of each request's emission times, pooled over
  requests; linear-interpolation percentiles; initial resumption gap: the gap of an already-decoding
  request that spans a new arrival; stalls: gaps above a threshold, their count and summed excess.
- TTFT, TPOT, E2E latency, makespan, throughput, goodput (vLLM's serving-benchmark conventions).
- busy fraction: time in engine calls over the makespan; near 1, arrivals outpace the engine.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain

import numpy as np

from sim.log import EventLog

SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2el"}


def nearest_rank(values, q: float) -> float:
    """`sorted[ceil(q*n)-1]`: the percentile tiny-llm reports."""
    v = np.sort(np.asarray(values, float))
    if not len(v):
        return math.nan
    return float(v[max(0, math.ceil(q * len(v)) - 1)])


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q * 100)) if len(values) else math.nan


@dataclass(frozen=True)
class Slo:
    """Per-request targets in milliseconds (None = no target)."""
    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None


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
    """(decoding request, arriving request, gap): the gap of each decoding request spanning an arrival."""
    out = []
    for rid_b, info_b in log.requests.items():
        ta = info_b.arrival
        for rid, t in log.tokens.items():
            if rid == rid_b or len(t) < 2 or not (t[0] <= ta < t[-1]):
                continue
            i = int(np.searchsorted(t, ta, "right"))  # first emission after the arrival
            out.append((rid, rid_b, t[i] - t[i - 1]))
    return out


def score(log: EventLog, slo: Slo | None = None, stall_ms: float = 100.0,
          resumption: bool | None = None) -> dict:
    """Every metric of the run, as a flat dict (times in ms unless the key says otherwise).

    `resumption` computes initial resumption gaps (quadratic in requests); by default only for
    traces of at most 200 requests.
    """
    m: dict = {}
    dg = decode_gaps(log) * 1e3
    m["decode_gap_p50_ms"] = nearest_rank(dg, 0.50)
    m["decode_gap_median_ms"] = float(np.median(dg)) if len(dg) else math.nan  # tiny-llm's statistics.median
    m["decode_gap_p95_ms"] = nearest_rank(dg, 0.95)
    m["decode_gap_max_ms"] = float(dg.max()) if len(dg) else math.nan

    itl = inter_token_gaps(log) * 1e3
    for q in (50, 95, 99):
        m[f"p{q}_itl_ms"] = _pct(itl, q / 100)
    m["mean_itl_ms"] = float(itl.mean()) if len(itl) else math.nan
    m["max_itl_ms"] = float(itl.max()) if len(itl) else math.nan
    over = itl[itl > stall_ms]
    m["stall_count"] = int(len(over))
    m["stall_excess_s"] = float((over - stall_ms).sum() / 1e3)

    if resumption if resumption is not None else len(log.requests) <= 200:
        rg = [g * 1e3 for _, _, g in resumption_gaps(log)]
        m["resume_gap_max_ms"] = max(rg) if rg else math.nan
        m["resume_gap_mean_ms"] = float(np.mean(rg)) if rg else math.nan

    rows = latency_rows(log)
    done = [r for r in rows if r["generated"] == r["output_len"]]
    ttft = np.array([r["ttft"] for r in done if r["ttft"] is not None]) * 1e3
    tpot = np.array([r["tpot"] for r in done if r["tpot"] is not None]) * 1e3
    e2el = np.array([r["e2el"] for r in done]) * 1e3
    for name, v in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
        m[f"mean_{name}_ms"] = float(v.mean()) if len(v) else math.nan
        for q in (50, 95, 99):
            m[f"p{q}_{name}_ms"] = _pct(v, q / 100)

    starts = [i.arrival for i in log.requests.values()]
    ends = [t[-1] for t in log.tokens.values() if t]
    makespan = max(ends) - min(starts) if ends else math.nan
    # tokens timed in this run: a prefilled request's first token came before the clock started
    out_tokens = sum(len(t) for t in log.tokens.values()) - sum(i.prefilled for i in log.requests.values())
    m["makespan_s"] = makespan
    m["completed"] = len(done)
    m["output_tokens"] = out_tokens
    m["output_tok_s"] = out_tokens / makespan if makespan > 0 else math.nan
    m["request_s"] = len(done) / makespan if makespan > 0 else math.nan
    if slo is not None:
        good = sum(1 for r in done if _meets(r, slo))
        m["goodput_req_s"] = good / makespan if makespan > 0 else math.nan
        m["slo_attained"] = good / len(rows) if rows else math.nan
    m["engine_calls"] = log.call_count
    # share of the run the engine was busy: near 1 means arrivals outpace it (queues grow)
    m["busy_frac"] = log.busy_seconds() / makespan if makespan > 0 else math.nan
    return m


def _meets(r: dict, slo: Slo) -> bool:
    for key, target in (("ttft", slo.ttft), ("tpot", slo.tpot), ("e2el", slo.e2el)):
        v = r.get(key)
        if target is not None and v is not None and v * 1e3 > target:
            return False
    return True


def parse_slo(items: list[str]) -> Slo:
    """`["ttft:2000", "tpot:100"]` -> Slo; ValueError naming the bad item."""
    kw = {}
    for item in items:
        key, _, val = item.partition(":")
        if key not in SLO_KEYS or not val:
            raise ValueError(f"--slo {item!r}: expected KEY:MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            kw[key] = float(val)
        except ValueError:
            raise ValueError(f"--slo {item!r}: {val!r} is not a number of milliseconds") from None
        if kw[key] <= 0:
            raise ValueError(f"--slo {item!r}: a target must be > 0 ms")
    return Slo(**kw)
