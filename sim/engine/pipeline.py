"""mlx-lm's `next()` as `mlx_lm.server` runs it: the host builds each call's graph while the device
still runs the calls before it.

BatchGenerator never waits for the step it has just queued. A generation step builds its forward,
queues it (`mx.async_eval`) and then waits only for the tokens of the forward before it, which it
returns; a first forward is queued and not waited for; a prompt call waits for everything queued
(it evaluates the cache). So on a device that runs calls in order, a call's time splits in two:
the host's part (building the graph: Python, a roughly constant time per kind of call) and the
device's (the rest of what the call costs when timed on its own, synchronized). A decode-only
iteration then lasts the longer of the device's step and the host's work, not their sum: on a GPU
the host's part is a large share of a short step, on this 2-vCPU CPU a few percent of qwen3-0.6b's.

`Pipeline` keeps the two clocks for one run: `call` takes the host's time at a call's start and
the call's price, and returns the host's time when the call returns, which is when the next call
starts (its logged span is host time, as the real run's marks are: `calibrate.engine.batchgen`).
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.engine.work import BatchPrefill, FirstForward, Generate, Work

KIND = {Generate: "generate", FirstForward: "first", BatchPrefill: "prompt"}  # the calls next() makes (a join: none)


@dataclass
class Pipeline:
    host: dict[str, float]  # seconds of a call's price the host spends building it, by kind
    device: float = 0.0  # when the device has run everything queued
    pending: float = 0.0  # when the tokens the next generation step returns are computed

    def call(self, kind: str, start: float, seconds: float) -> float:
        """A call of `kind` ("generate", "first" or "prompt") priced `seconds`, its host part
        starting at `start`: the host's time when it returns."""
        if not seconds:  # a join: its copies are lazy, paid by the call that evaluates them
            return start
        host = min(self.host.get(kind, 0.0), seconds)
        t = start + host
        self.device = max(t, self.device) + (seconds - host)
        if kind == "generate":  # returns the previous forward's tokens, queues its own
            t, self.pending = max(t, self.pending), self.device
        elif kind == "first":  # the next step returns its tokens too
            self.pending = self.device
        elif kind == "prompt":  # evaluates the batch's cache
            t = self.device
        return t

    def work(self, w: Work, start: float, seconds: float) -> float:
        """`call` for the engine's work item `w` (`sim.engine.work`)."""
        return self.call(KIND.get(type(w), ""), start, seconds)
