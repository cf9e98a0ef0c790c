"""The metrics of one run, tallied as its events come: in memory that does not grow with the calls.

`sim.metrics.scoring` defines every metric (by the seeds' and vLLM's conventions) and scores a whole
event log through a `Tally`; `sim.metrics.scored_log` feeds one during a replay, so a week-long trace is
scored without keeping its hundreds of millions of calls and tokens. What a tally holds:

- per request, once it is done: its emission times (its inter-token gaps, stalls, resumption
  gaps, TTFT, TPOT, E2E latency), then nothing but a few figures;
- decode-call end times until the gaps between them can be judged (a gap counts only while some
  request that had arrived was unfinished, so the requests finished by then must be known);
- each metric's values in a `sim.metrics.quantiles.Distribution`: exact up to a million values, a
  sketch with a stated relative error (0.1%) on percentiles beyond. Counts, sums, means,
  standard deviations, maxima, throughputs, goodput and the resumption gaps stay exact.

Memory: the request table (a few numbers per request: the trace's own size), the requests in
flight, and at most a million values per distribution.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from sim.engine.memory import GB
from sim.metrics.quantiles import ALPHA, CAP, Distribution
from sim.metrics.registry import NAMES

FLUSH = 1 << 16  # decode ends buffered before they go into numpy
DONE_FLUSH = 1 << 12  # emission times of finished requests buffered before they are tallied (32 KiB)


@dataclass(frozen=True)
class Slo:
    """Per-request targets in milliseconds (None = no target)."""
    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None


@dataclass
class RequestTable:
    """The requests of a run as columns (index i is the i-th request of the trace or log)."""
    ids: list[str]
    arrival: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prefilled: np.ndarray

    @staticmethod
    def of(requests) -> "RequestTable":
        """From `Request`s (a trace's) or `RequestInfo`s (a log's): anything with these fields."""
        reqs = list(requests)
        n = len(reqs)
        rid = [getattr(r, "id", None) or getattr(r, "rid") for r in reqs]
        return RequestTable(rid, np.fromiter((r.arrival for r in reqs), float, n),
                            np.fromiter((r.prompt_len for r in reqs), np.int64, n),
                            np.fromiter((r.output_len for r in reqs), np.int64, n),
                            np.fromiter((r.prefilled for r in reqs), bool, n))

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class RequestFigures:
    """Per-request figures in seconds (NaN where undefined), kept only when asked."""
    generated: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    e2el: np.ndarray
    gap_max: np.ndarray
    gap_p95: np.ndarray

    @staticmethod
    def empty(n: int) -> "RequestFigures":
        nan = lambda: np.full(n, np.nan)
        return RequestFigures(np.zeros(n, np.int64), nan(), nan(), nan(), nan(), nan())


class Tally:
    def __init__(self, table: RequestTable, slo: Slo | None = None, stall_ms: float = 100.0, cap: int = CAP,
                 keep_rows: bool = False) -> None:
        self.table, self.slo, self.stall_ms = table, slo, stall_ms
        self.arrivals = np.sort(table.arrival)
        dist = lambda: Distribution(cap)
        self.gaps, self.itl, self.ttft, self.tpot, self.e2el = dist(), dist(), dist(), dist(), dist()
        self.rows = RequestFigures.empty(len(table)) if keep_rows else None
        self.stalls, self.stall_excess_ms = 0, 0.0
        self.resume_max, self.resume_sum, self.resume_n = -math.inf, 0.0, 0
        self.tokens = self.completed = self.input_tokens = self.good = 0
        self.last_token = -math.inf
        self.calls, self.busy = 0, 0.0
        self.peak_memory: float | None = None  # bytes at the run's peak (`sim.engine.memory`), None: not known
        self.preempted, self.recomputed = 0, 0  # preemptions by the KV limit, the tokens they freed
        # last emission of every request done and not yet behind every judged gap, in the order done;
        # those behind are only counted (`_judge`): the list does not grow with the run
        self._finish: list[float] = []
        self._finish_sorted = True
        self._finished_before = 0  # requests done at or before the latest judged gap's start
        self._emitted_any = False
        self._done_i: list[int] = []  # requests done, their emission counts and times, not yet tallied
        self._done_n: list[int] = []
        self._done_t = array("d")
        self._ends = array("d")  # decode ends whose gaps are not judged yet (`_judge`): C arrays that numpy
        self._its = array("q")  # reads without converting a Python object per call

    # ---- events ------------------------------------------------------------------------------

    def request_done(self, i: int, times) -> None:
        """Request `i` is done (or the run ended) with these emission times, in order. Buffered and
        tallied in bulk (`_tally_requests`): numpy on one request's few gaps at a time was most of
        a replay's scoring."""
        held = len(self._done_t)
        self._done_t.extend(times.tolist() if isinstance(times, np.ndarray) else times)
        self._done_i.append(i)
        self._done_n.append(len(self._done_t) - held)
        if len(self._done_t) >= DONE_FLUSH:
            self._tally_requests()

    def _tally_requests(self) -> None:
        """Every buffered request's figures: its gaps, stalls, resumption gaps and latencies."""
        if not self._done_i:
            return
        idx = np.asarray(self._done_i, np.int64)
        n = np.asarray(self._done_n, np.int64)
        t = np.frombuffer(self._done_t, float).copy()
        self._done_i, self._done_n, self._done_t = [], [], array("d")
        self.tokens += int(n.sum())
        arrival, prefilled = self.table.arrival[idx], self.table.prefilled[idx]
        last_at = np.cumsum(n) - 1
        emitted = n > 0
        last = t[last_at[emitted]]
        if len(last):
            if (self._finish and last[0] < self._finish[-1]) or np.any(np.diff(last) < 0):
                self._finish_sorted = False
            self._finish.extend(last.tolist())
            self._emitted_any = True
            self.last_token = max(self.last_token, float(last.max()))
        # a gap is between two emissions of one request: owner[k] is the request of emission k
        owner = np.repeat(np.arange(len(n)), n)
        inner = owner[1:] == owner[:-1]
        before, after, own = t[:-1][inner], t[1:][inner], owner[1:][inner]
        gaps = after - before
        ms = gaps * 1e3
        self.itl.add(ms)
        over = ms[ms > self.stall_ms]
        self.stalls += len(over)
        self.stall_excess_ms += float((over - self.stall_ms).sum())
        # resumption gaps: each other request arriving in [before, after) makes the gap one
        arr = arrival[own]
        k = np.searchsorted(self.arrivals, after, "left") - np.searchsorted(self.arrivals, before, "left")
        k -= (before <= arr) & (arr < after)  # its own arrival is no resumption
        hit = k > 0
        if hit.any():
            self.resume_max = max(self.resume_max, float(gaps[hit].max()))
            self.resume_sum += float((gaps * k).sum())
            self.resume_n += int(k.sum())
        padded = np.append(t, np.nan)  # a request that emitted nothing reads the NaN at the end
        first = padded[np.where(emitted, last_at - n + 1, len(t))]
        end = padded[np.where(emitted, last_at, len(t))]
        ttft = np.where(~prefilled, first - arrival, np.nan)
        e2el = end - arrival
        tpot = np.where(n > 1, (end - first) / np.maximum(n - 1, 1), np.nan)
        done = n == self.table.output_len[idx]
        self.completed += int(done.sum())
        self.input_tokens += int(self.table.prompt_len[idx][done & ~prefilled].sum())
        for dist, v in ((self.ttft, ttft), (self.tpot, tpot), (self.e2el, e2el)):
            v = v[done]
            dist.add(v[~np.isnan(v)] * 1e3)
        if self.slo is not None:
            self.good += int((done & _meet(ttft, self.slo.ttft) & _meet(tpot, self.slo.tpot)
                              & _meet(e2el, self.slo.e2el)).sum())
        if self.rows is not None:
            rows = self.rows
            rows.generated[idx], rows.ttft[idx], rows.tpot[idx], rows.e2el[idx] = n, ttft, tpot, e2el
            if len(gaps):  # each request with two emissions or more owns one run of `gaps`
                starts = np.flatnonzero(np.r_[True, own[1:] != own[:-1]])
                two = idx[n >= 2]
                rows.gap_max[two] = np.maximum.reduceat(gaps, starts)
                rows.gap_p95[two] = p95_of_runs(gaps, own, starts)

    def decode_calls(self, ends, iterations) -> None:
        """Decode calls' end times and iterations, in time order."""
        if isinstance(ends, np.ndarray):
            self._ends.frombytes(ends.astype(float).tobytes())
            self._its.frombytes(np.asarray(iterations, np.int64).tobytes())
        else:
            self._ends.extend(ends)
            self._its.extend(iterations)
        if len(self._ends) >= FLUSH:
            self._judge(final=False)

    def decode_call(self, end: float, iteration: int) -> None:
        self._ends.append(end)
        self._its.append(iteration)
        if len(self._ends) >= FLUSH:
            self._judge(final=False)

    def engine_calls(self, n: int, busy_seconds: float) -> None:
        """`n` calls of the log (its "preempt" calls too: `preemptions` says how many are those)."""
        self.calls += n
        self.busy += busy_seconds

    def preemptions(self, n: int, tokens: int) -> None:
        """`n` preemptions by the KV limit, freeing `tokens` cached tokens (recomputed later)."""
        self.preempted += n
        self.recomputed += tokens

    # ---- decode-completion gaps ----------------------------------------------------------------

    def _judge(self, final: bool) -> None:
        """Judge the gaps between buffered decode ends (tiny-llm's rule, `sim.metrics.scoring.decode_gaps`):
        a gap counts if its calls are in the same or consecutive iterations and some request that
        had arrived by its start was unfinished then. Before the run ends, only gaps that start
        before the last end are judged: every request finished by then is known (calls come in
        time order). The first end buffered is the start of the next gap, never a gap's end."""
        self._tally_requests()  # the requests finished by now are known
        ends = np.frombuffer(self._ends, float).copy()
        if len(ends) < 2:
            return
        its = np.frombuffer(self._its, np.int64).copy()
        if np.any(np.diff(ends) < 0):
            raise ValueError("decode calls fed out of time order")
        prev = ends[:-1]
        m = len(prev) if final else int(np.searchsorted(prev, ends[-1], "left"))
        if m:
            finish = np.asarray(self._finish, float)
            if not self._finish_sorted:
                finish.sort()
            p = prev[:m]
            done = self._finished_before + np.searchsorted(finish, p, "right")
            busy = np.searchsorted(self.arrivals, p, "right") > done
            ok = (np.diff(its[:m + 1]) <= 1) & busy
            self.gaps.add(((ends[1:m + 1] - p) * 1e3)[ok])
            # every later gap starts at or after p[-1] (calls come in time order): a request done by
            # then is done for all of them, and needs counting only
            behind = int(np.searchsorted(finish, p[-1], "right"))
            self._finished_before += behind
            self._finish, self._finish_sorted = finish[behind:].tolist(), True
        self._ends, self._its = array("d", ends[m:].tobytes()), array("q", its[m:].tobytes())

    # ---- the result -----------------------------------------------------------------------------

    def result(self) -> dict:
        """Every metric, in the registry's order (NaN where the run cannot measure one)."""
        self._judge(final=True)
        m: dict = {}
        g = self.gaps
        m["decode_gap_p50_ms"] = g.nearest_rank(0.50)
        m["decode_gap_median_ms"] = g.median()
        m["decode_gap_p95_ms"] = g.nearest_rank(0.95)
        m["decode_gap_max_ms"] = g.max()
        _stats(self.itl, "itl", m)
        m["max_itl_ms"] = self.itl.max()
        m["stall_count"] = self.stalls
        m["stall_excess_s"] = self.stall_excess_ms / 1e3
        m["resume_gap_max_ms"] = self.resume_max * 1e3 if self.resume_n else math.nan
        m["resume_gap_mean_ms"] = self.resume_sum / self.resume_n * 1e3 if self.resume_n else math.nan
        for name in ("ttft", "tpot", "e2el"):
            _stats(getattr(self, name), name, m)
        first = float(self.table.arrival.min()) if len(self.table) else math.nan
        makespan = self.last_token - first if self._emitted_any else math.nan
        per_s = (lambda n: n / makespan) if makespan > 0 else (lambda n: math.nan)
        out_tokens = self.tokens - int(self.table.prefilled.sum())  # a prefilled request's first token came before the clock
        m["makespan_s"] = makespan
        m["completed"] = self.completed
        m["total_input_tokens"] = self.input_tokens
        m["total_output_tokens"] = out_tokens
        m["request_throughput"] = per_s(self.completed)
        m["output_throughput"] = per_s(out_tokens)
        m["total_token_throughput"] = per_s(self.input_tokens + out_tokens)
        m["request_goodput"] = per_s(self.good) if self.slo is not None else math.nan
        m["slo_attained"] = self.good / len(self.table) if self.slo is not None and len(self.table) else math.nan
        m["engine_calls"] = self.calls - self.preempted  # a preemption runs no kernel
        m["preemptions"] = self.preempted
        m["recomputed_tokens"] = self.recomputed
        m["busy_frac"] = per_s(self.busy)
        m["peak_memory_gb"] = self.peak_memory / GB if self.peak_memory is not None else math.nan
        return {name: m[name] for name in NAMES}

    def estimated(self) -> dict[str, float]:
        """The metrics that are estimates, each with its relative error bound (empty: all exact)."""
        out = {}
        for prefix, dist, names in (
                ("decode_gap", self.gaps, ("decode_gap_p50_ms", "decode_gap_median_ms", "decode_gap_p95_ms")),
                ("itl", self.itl, ("median_itl_ms", "p50_itl_ms", "p95_itl_ms", "p99_itl_ms")),
                ("ttft", self.ttft, ("median_ttft_ms", "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms")),
                ("tpot", self.tpot, ("median_tpot_ms", "p50_tpot_ms", "p95_tpot_ms", "p99_tpot_ms")),
                ("e2el", self.e2el, ("median_e2el_ms", "p50_e2el_ms", "p95_e2el_ms", "p99_e2el_ms"))):
            if not dist.exact:
                out.update({n: dist.alpha for n in names})
        return out


def _stats(d: Distribution, name: str, out: dict) -> None:
    """vLLM's summary of one latency list: mean, median, std (population), p50, p95, p99."""
    out[f"mean_{name}_ms"] = d.mean()
    out[f"median_{name}_ms"] = d.median()
    out[f"std_{name}_ms"] = d.std()
    for q in (50, 95, 99):
        out[f"p{q}_{name}_ms"] = d.percentile(q / 100)


def p95_of_runs(values: np.ndarray, run: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """`np.percentile(v, 95)` of each run of `values` (`run`: the run of each, nondecreasing;
    `starts`: where each begins), all at once with numpy's own arithmetic, so each float is the
    one it gives (a test checks), instead of one `np.percentile` call per request."""
    ordered = values[np.lexsort((values, run))]
    m = np.diff(np.r_[starts, len(values)])
    v = (m - 1) * 0.95  # numpy's "linear" method: the virtual index, its floor and the weight
    below = np.floor(v)
    last = v >= m - 1  # the top of the run: numpy takes its largest value
    lo = np.where(last, m - 1, below).astype(np.intp)
    hi = np.where(last, m - 1, below + 1).astype(np.intp)
    a, b, g = ordered[starts + lo], ordered[starts + hi], v - below
    d = b - a
    return np.where(last, a, np.where(g >= 0.5, b - d * (1 - g), a + d * g))


def _meet(seconds: np.ndarray, target_ms: float | None) -> np.ndarray:
    """Whether each value meets its SLO target (an undefined value, NaN, meets any)."""
    if target_ms is None:
        return np.ones(len(seconds), bool)
    return ~(seconds * 1e3 > target_ms)


ESTIMATE_NOTE = (f"percentiles and medians of a metric with more than {CAP:,} values are estimated "
                 f"within {ALPHA:.1%} (relative); every other figure is exact")
