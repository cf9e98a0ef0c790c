"""The event log a replay writes when nobody keeps it: each call and token is tallied, then let go.

`sim.engine.log.EventLog` keeps every call and emission of a run (hundreds of bytes per call): a
week-long trace, hundreds of millions of calls, would need tens of gigabytes. A `ScoredLog`
takes its place in the engine state (`simulate(..., log=ScoredLog(trace))`) and offers what the
state writes to (`requests`, `tokens`, `add`, `add_stretch`), but holds only the emission times
of requests still in flight: when a request emits its last token, its times go into the run's
`sim.metrics.tally.Tally` and are dropped; decode calls give the tally their end times, every call its
duration. With `writer`, every call and token also goes to a columnar log file
(`sim.metrics.logfile`), written as it comes.

Memory: the trace's request table, the requests in flight, and the tally's bounded buffers.
"""
from __future__ import annotations

from operator import sub
from typing import Callable

from sim.engine.log import DECODE_KINDS, Call, Stretch
from sim.metrics.tally import RequestTable, Slo, Tally
from traces.trace import Trace


class _Ignored(dict):
    """`requests` as the engine state fills it: the tally has the trace's table already."""

    def __setitem__(self, key, value) -> None:
        pass


class _InFlight(dict):
    """Emission times by request, holding only requests that have emitted and are not done: the
    state's empty list for every request is not kept; a request's list appears with its first token."""

    def __setitem__(self, key, value) -> None:
        pass

    def __missing__(self, rid: str) -> list[float]:
        times: list[float] = []
        dict.__setitem__(self, rid, times)
        return times


class ScoredLog:
    def __init__(self, trace: Trace, slo: Slo | None = None, stall_ms: float = 100.0, keep_rows: bool = False,
                 writer=None, on_done: Callable[[], object] | None = None) -> None:
        self.table = RequestTable.of(trace.requests)
        self.tally = Tally(self.table, slo, stall_ms, keep_rows=keep_rows)
        self.requests = _Ignored()
        self.tokens = _InFlight()
        self.index = {rid: i for i, rid in enumerate(self.table.ids)}
        self.outputs = self.table.output_len.tolist()
        self.writer = writer
        self.on_done = on_done  # called as each request is tallied (a progress bar's `update`)
        # an mlx-lm generation step (iteration, end, rids): it completes, and its tokens are emitted,
        # when its next() returns, at the end of its iteration's last call (`EventLog.decode_ends`)
        self._generate: tuple[int, float, tuple[str, ...]] | None = None
        self.call_count = 0
        self._busy = 0.0
        self.peak_memory: float | None = None  # bytes, set by the engine state (`sim.engine.memory`)
        self._closed = False

    # ---- what the engine state calls ------------------------------------------------------------

    def add(self, call: Call) -> None:
        self.call_count += 1
        self._busy += call.end - call.start
        if self.writer is not None:
            self.writer.call(call)
        if self._generate is not None:
            if call.iteration == self._generate[0]:
                self._generate = (call.iteration, call.end, self._generate[2])
            else:
                self._end_generate()
        if call.kind == "generate":
            self._generate = (call.iteration, call.end, call.rids)
        elif call.kind == "decode" or (call.kind == "mixed" and call.batched):  # (a decode rode in vLLM's forward)
            self.tally.decode_call(call.end, call.iteration)
        elif call.kind == "preempt":
            self.tally.preemptions(1, call.tokens)

    def _end_generate(self) -> None:
        it, end, rids = self._generate
        self._generate = None
        self.tally.decode_call(end, it)
        for rid in rids:
            self._check(rid)

    def add_stretch(self, stretch: Stretch) -> None:
        if self._generate is not None:
            self._end_generate()
        self.call_count += len(stretch)
        ends, its = [], []
        for col in stretch.columns:
            self._busy += sum(map(sub, col.ends, col.starts))
            if col.kind in DECODE_KINDS:
                ends += col.ends
                its += range(stretch.iteration, stretch.iteration + len(col.ends))
        if self.writer is not None:
            for call in stretch.calls():
                self.writer.call(call)
        if len(stretch.columns) > 1 and ends:  # several decode columns: their calls interleave in time
            order = sorted(range(len(ends)), key=ends.__getitem__)
            ends, its = [ends[i] for i in order], [its[i] for i in order]
        self.tally.decode_calls(ends, its)
        for col in stretch.columns:
            if col.kind == "generate":  # mlx-lm's (pdsim's and vLLM's requests say when they are `done`)
                for rid in col.rids:
                    self._check(rid)

    def done(self, rid: str) -> None:
        """The engine state says `rid` emitted its last token (its time final: pdsim's and vLLM's calls)."""
        self._check(rid)

    def _check(self, rid: str) -> None:
        """Tally `rid` if it has emitted its last token."""
        times = dict.get(self.tokens, rid)
        if times is not None and len(times) >= self.outputs[self.index[rid]]:
            self._done(rid, times)

    def _done(self, rid: str, times: list[float]) -> None:
        i = self.index[rid]
        self.tally.request_done(i, times)
        if self.writer is not None:
            self.writer.tokens(i, times)
        dict.__delitem__(self.tokens, rid)
        if self.on_done is not None:
            self.on_done()

    # ---- the result -------------------------------------------------------------------------

    def close(self) -> Tally:
        """Tally what is left (requests the run did not finish) and return the tally; once."""
        if not self._closed:
            if self._generate is not None:
                self._end_generate()
            for rid, times in list(self.tokens.items()):
                self._done(rid, times)
            self.tally.engine_calls(self.call_count, self._busy)
            self.tally.peak_memory = self.peak_memory
            self._closed = True
        return self.tally

    def busy_seconds(self) -> float:
        return self._busy


def simulate_scored(trace: Trace, policy, cost, slo: Slo | None = None, stall_ms: float = 100.0,
                    keep_rows: bool = False, writer=None, on_done: Callable[[], object] | None = None) -> Tally:
    """Replay `trace` and tally it as it runs (`sim.replay.simulate` with a `ScoredLog`): the
    metrics of `sim.metrics.scoring.score`, in memory that does not grow with the run's calls.
    `on_done`: called as each request finishes."""
    from sim.replay import simulate
    log = ScoredLog(trace, slo, stall_ms, keep_rows, writer, on_done)
    simulate(trace, policy, cost, log=log)
    return log.close()
