"""chunked and eager: tiny-llm's Day 2 and Day 1 loops, and meTile's chunked and eager.

Each iteration: the one pending request (the oldest queued, or the first in the queue order:
`policies.queue`) prefills at most `budget` tokens; once its prefill is done it takes a free
decode slot, and waits for one if the batch is full, holding back the next prefill (so at most
one prefilled request waits for a slot, and slots are taken in order of prefill completion). Then one decode for every request in a slot. `order` puts the
decodes before the chunk (meTile) or after it (tiny-llm, where a request that finishes its
prefill joins the same iteration's decode, and a request that waited for a slot takes it in an
iteration that only decodes: tiny-llm's `run_batch_requests_serving` takes the next pending
request only in the iteration after). eager is chunked with no budget: a whole prompt in one call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import ClassVar

from policies.base import Options
from sim.state import EngineState
from sim.work import Prefill, Work


@dataclass
class Chunked:
    opts: Options = field(default_factory=lambda: Options(budget=128))
    name: str = "chunked"
    steady: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.queue_order = self.opts.queue_order()  # which waiting prompt starts next

    def schedule(self, state: EngineState) -> list[Work]:
        o = self.opts
        ready = list(islice(state.ready, o.batch_size + 1))  # the slots, and whether one waits
        slots, blocked = ready[:o.batch_size], len(ready) > o.batch_size
        chunk: list[Work] = []
        # tiny-llm: a request that waited for a slot takes it in an iteration with no prefill
        taking = o.order == "chunk-first" and any(state.ready[r].generated == 1 and not state.ready[r].req.prefilled
                                                   for r in slots)
        s = self.queue_order.next(state) if state.queued and not blocked and not taking else None
        if s is not None:
            n = min(s.prefill_left, o.budget or s.prefill_left)
            chunk = [Prefill(s.rid, n)]
            joins = o.order == "chunk-first" and n == s.prefill_left and s.output_left > 1
            if joins and len(slots) < o.batch_size:
                slots = slots + [s.rid]
        decodes = o.decodes(slots)
        return chunk + decodes if o.order == "chunk-first" else decodes + chunk


def eager(opts: Options) -> Chunked:
    return Chunked(Options(None, opts.batch_size, opts.decode, opts.order, opts.queue, opts.aging_s), "eager")
