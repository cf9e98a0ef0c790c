"""mlx-lm's `next()` as `mlx_lm.server` runs it: the host builds each call's graph while the device
still runs the calls before it.

BatchGenerator does not wait for the step it has just queued. A generation step builds its forward,
queues it (`mx.async_eval`) and then waits only for the tokens of the forward before it, which it
returns; a first forward is queued and not waited for; a prompt call waits for everything queued
(it evaluates the cache). Two things wait for the device besides: a batch's `filter` reads its
rows' padding (`BatchKVCache.filter`: `left_padding.tolist()`), which on a stream that runs in
order waits for all that is queued; so a step that some rows leave returns only when its own
forward has run, and a first forward (split off the prompt batch, both sides filtered) is built
only when the device is idle. A step after rows joined or left waits for its own forward too: its
input tokens are a new array (the last tokens gathered by the filter, or concatenated with the
joining rows' by `extend`), evaluated with the forward that reads them, and MLX signals an
evaluation's arrays when all of it has run (a fresh calibration's pipelined held-out run priced
such steps at 0.75 of their spans without this rule, 0.97 with it). And `mx.async_eval` itself
returns only once few enough of the graph's tasks are left to run (MLX bounds the tasks in
flight): on this CPU with 82 ms of a 310-380 ms qwen3-0.6b step left (its `tail`), so its tokens
come about when that step ends.

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
from typing import Iterable, Iterator, Sequence

from sim.engine.work import BatchPrefill, FirstForward, Generate, JoinPrompt, Work

KIND = {Generate: "generate", FirstForward: "first", BatchPrefill: "prompt"}  # the calls next() makes (a join: none)


@dataclass
class Pipeline:
    host: dict[str, float]  # seconds of a call's price the host spends building it, by kind
    tail: dict[str, float] = field(default_factory=dict)  # device seconds left when its queueing returns (none: all)
    device: float = 0.0  # when the device has run everything queued
    pending: float = 0.0  # when the tokens the next generation step returns are computed

    def call(self, kind: str, start: float, seconds: float, leaving: bool = False, renewed: bool = False,
             split_after: bool = False) -> float:
        """A call of `kind` ("generate", "first" or "prompt") priced `seconds`, its host part
        starting at `start`: the host's time when the next call starts (its span's end).
        `leaving`: rows leave the generation batch after this step (its filter waits for the
        device); `renewed`: its rows changed since the last step (`renewed`), so it waits for its
        own forward's tokens; `split_after`: a first forward follows in the same next(), split off
        the prompt batch by filters that wait for the device before that call is made, so in this
        call's span (a call's clock is read as the model is called)."""
        if not seconds:  # a join: its copies are lazy, paid by the call that evaluates them
            return start
        if kind == "first":  # split off the prompt batch: its filters waited for the device (`split_after`)
            start = max(start, self.device)
        host = min(self.host.get(kind, 0.0), seconds)
        t = start + host
        self.device = max(t, self.device) + (seconds - host)
        t = max(t, self.device - self.tail.get(kind, math.inf))  # `mx.async_eval` returns
        if kind == "generate":  # returns the previous forward's tokens, queues its own
            t, self.pending = (self.device if leaving or renewed else max(t, self.pending)), self.device
        elif kind == "first":  # the next step returns its tokens too
            self.pending = self.device
        elif kind == "prompt":  # evaluates the batch's cache
            t = self.device
        return max(t, self.device) if split_after else t

    def returned(self, modelled: float, measured: float) -> None:
        """A measured run's call returned at `measured` where `call` had it return at `modelled`:
        what the device had still queued past the modelled return is moved to the measured one,
        so a run slower or faster than its prices leaves the device's clock neither behind nor
        ahead (a prompt call or a leave: the device idle at its return; a step: its tail left)."""
        def moved(at: float) -> float:
            return measured + (at - modelled) if at > modelled else min(at, measured)
        self.device, self.pending = moved(self.device), moved(self.pending)

    def work(self, w: Work, start: float, seconds: float, ready: dict, stepped: Sequence[str],
             then: Sequence[Work] = ()) -> float:
        """`call` for the engine's work item `w` (`sim.engine.work`); `ready`: the engine state's
        generating requests before the call (`EngineState.ready`), which say who leaves after it;
        `stepped`: the generation batch's rows at its last step (`EngineState.stepped`); `then`:
        the iteration's work after it."""
        split = next((isinstance(v, FirstForward) for v in then if not isinstance(v, JoinPrompt)), False)
        if not isinstance(w, Generate):
            return self.call(KIND.get(type(w), ""), start, seconds, split_after=split)
        leaving = any(ready[r].output_left == 1 for r in w.rids)
        return self.call("generate", start, seconds, leaving, renewed(w.rids, stepped), split)


def renewed(rids: Sequence[str], stepped: Sequence[str]) -> bool:
    """Whether a generation step of `rids` reads new input tokens, the generation batch's rows at
    its last step being `stepped`: rows left while others stayed (the filter gathers the tokens),
    or joined rows that stayed (`extend` concatenates theirs), or joined the generator's first
    batch (concatenated onto its empty one). Rows joining a batch that every row left take their
    tokens as they are (the filter set none)."""
    if not stepped:
        return True
    kept = sum(r in rids for r in stepped)
    return 0 < kept and (kept < len(stepped) or kept < len(rids))


def logged_returns(pipe: Pipeline, calls: Iterable, prices: Iterable[float], outputs: dict[str, int]
                   ) -> Iterator[float]:
    """Each logged call's return on the host as `pipe` times it from the call's measured start
    (`sim.metrics.residuals.priced_calls`), the device's clock then moved with the measured return
    (`Pipeline.returned`), so one mispriced call does not move every later one, and a run slower
    than its prices does not find the device idle at every step (steps priced a tail early: on a
    run at 0.84-0.92x the calibration's speed, single-row steps read 0.6-0.7 with the clock only
    set back, 0.8-0.9 moved both ways); `outputs`: each request's output length, which says
    which steps rows leave after."""
    given: dict[str, int] = {}
    stepped: tuple[str, ...] = ()
    calls = list(calls)
    for i, (c, seconds) in enumerate(zip(calls, prices)):
        leaving = fresh = False
        if c.kind == "generate":
            for r in c.rids:
                given[r] = given.get(r, 0) + 1
                leaving = leaving or given[r] == outputs[r]
            fresh, stepped = renewed(c.rids, stepped), c.rids
        split = i + 1 < len(calls) and calls[i + 1].kind == "first" and calls[i + 1].iteration == c.iteration
        back = pipe.call(c.kind, c.start, seconds, leaving, fresh, split)
        yield back
        pipe.returned(back, c.end)
