"""mlx-lm's `next()` as `mlx_lm.server` runs it: the host builds each call's graph while the device
still runs the calls before it.

BatchGenerator does not wait for the step it has just queued. A generation step builds its forward,
queues it (`mx.async_eval`) and then waits only for the tokens of the forward before it, which it
returns; a first forward is queued and not waited for; a prompt call waits for everything queued
(it evaluates the cache). Two things wait for the device besides: a batch's `filter` reads its
rows' padding (`BatchKVCache.filter`: `left_padding.tolist()`), which on a stream that runs in
order waits for all that is queued; so a step that some rows leave returns only when its own
forward has run, and a first forward (split off the prompt batch, both sides filtered) is built
only when the device is idle. And `mx.async_eval` itself returns only once few enough of the
graph's tasks are left to run (MLX bounds the tasks in flight): on this CPU with 82 ms of a
310-380 ms qwen3-0.6b step left (its `tail`), so its tokens come about when that step ends.

So a call's time splits in two: the host's part (building the graph: Python and, on a GPU,
encoding its kernels; measured as the thread's CPU time, which waits do not take) and the
device's (the rest of what the call costs when timed on its own, synchronized). A run of steps
goes at the pace of the slower of the two, not their sum: on this 2-vCPU CPU the host's part of a
qwen3-0.6b step is 19 ms (a fresh calibration's median), on a GPU a large share of a short step.

`Pipeline` keeps the two clocks for one run: `call` takes the host's time at a call's start and
the call's price, and returns the host's time when the call returns, which is when the next call
starts (its logged span is host time, as the real run's marks are: `calibrate.engine.batchgen`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from sim.engine.work import BatchPrefill, FirstForward, Generate, Work

KIND = {Generate: "generate", FirstForward: "first", BatchPrefill: "prompt"}  # the calls next() makes (a join: none)


@dataclass
class Pipeline:
    host: dict[str, float]  # seconds of a call's price the host spends building it, by kind
    tail: dict[str, float] = field(default_factory=dict)  # device seconds left when its queueing returns (none: all)
    device: float = 0.0  # when the device has run everything queued
    pending: float = 0.0  # when the tokens the next generation step returns are computed

    def call(self, kind: str, start: float, seconds: float, leaving: bool = False) -> float:
        """A call of `kind` ("generate", "first" or "prompt") priced `seconds`, its host part
        starting at `start`: the host's time when it returns. `leaving`: rows leave the
        generation batch after this step (its filter waits for the device)."""
        if not seconds:  # a join: its copies are lazy, paid by the call that evaluates them
            return start
        if kind == "first":  # split off the prompt batch: its filters waited for the device
            start = max(start, self.device)
        host = min(self.host.get(kind, 0.0), seconds)
        t = start + host
        self.device = max(t, self.device) + (seconds - host)
        t = max(t, self.device - self.tail.get(kind, math.inf))  # `mx.async_eval` returns
        if kind == "generate":  # returns the previous forward's tokens, queues its own
            t, self.pending = (self.device if leaving else max(t, self.pending)), self.device
        elif kind == "first":  # the next step returns its tokens too
            self.pending = self.device
        elif kind == "prompt":  # evaluates the batch's cache
            t = self.device
        return t

    def idle(self, at: float) -> None:
        """A measured run shows the device done with what is queued by `at`."""
        self.device, self.pending = min(self.device, at), min(self.pending, at)

    def work(self, w: Work, start: float, seconds: float, ready: dict) -> float:
        """`call` for the engine's work item `w` (`sim.engine.work`); `ready`: the engine state's
        generating requests before the call (`EngineState.ready`), which say who leaves after it."""
        leaving = isinstance(w, Generate) and any(ready[r].output_left == 1 for r in w.rids)
        return self.call(KIND.get(type(w), ""), start, seconds, leaving)


def logged_returns(pipe: Pipeline, calls: Iterable, prices: Iterable[float], outputs: dict[str, int]
                   ) -> Iterator[float]:
    """Each logged call's return on the host as `pipe` times it from the call's measured start
    (`sim.metrics.residuals.priced_calls`), the device's clock set back to what the run shows:
    idle at a prompt call's end and a leave's, at most a call's tail behind its return, so one
    mispriced call does not move every later one; `outputs`: each request's output length, which
    says which steps rows leave after."""
    given: dict[str, int] = {}
    for c, seconds in zip(calls, prices):
        leaving = False
        if c.kind == "generate":
            for r in c.rids:
                given[r] = given.get(r, 0) + 1
                leaving = leaving or given[r] == outputs[r]
        yield pipe.call(c.kind, c.start, seconds, leaving)
        pipe.idle(c.end if c.kind == "prompt" or leaving else c.end + pipe.tail.get(c.kind, math.inf))
