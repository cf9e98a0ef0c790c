"""chunked and eager: tiny-llm's Day 2 and Day 1 loops, and meTile's chunked and eager.

Each iteration: the one pending request (the oldest queued, or the first in the queue order:
`policies.queue`) prefills at most `budget` tokens; once its prefill is done it takes a free
decode slot, and waits for one if the batch is full, holding back the next prefill (so at most
one prefilled request waits for a slot, and slots are taken in order of prefill completion).
Then one decode for every request in a slot. `order` puts the decodes before the chunk (meTile)
or after it (tiny-llm, where a request that finishes its prefill joins the same iteration's
decode, and a request that waited for a slot takes it in an iteration that only decodes:
tiny-llm's `run_batch_requests_serving` takes the next pending request only in the iteration
after). eager is chunked with no budget: a whole prompt in one call.

The budget may adapt (`policies.budget`): `auto:MS` prices each candidate chunk with the cost
model the policy was built with (`cost`, handed in by whoever runs it: the simulator's, or on
the real engine the profile confirm was given), and `idle_budget="whole"` runs the whole prompt
when no request is decoding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import ClassVar

from policies.base import PolicyError
from policies.budget import largest_fitting
from policies.options import Options
from policies.queue import QueueOrder
from sim.cost.model import CostModel
from sim.cost.price import host_seconds, iteration_seconds
from sim.engine.memory import KVLimit
from sim.engine.requests import RequestState
from sim.engine.state import EngineState
from sim.engine.work import Prefill, Work


@dataclass
class Chunked:
    opts: Options = field(default_factory=lambda: Options(budget=128))
    name: str = "chunked"
    cost: CostModel | None = None  # the cost model an `auto:MS` budget prices chunks with (`sim.cost.model`)
    engine: ClassVar[str] = "pdsim"
    steady: ClassVar[bool] = True
    queues_arrivals: ClassVar[bool] = True  # an arrival queues behind the waiting prompts (fcfs: `sim.steady.stretch_end`)

    @property
    def steady_chunks(self) -> bool:
        """An `auto` chunk changes from one iteration to the next (the prefix and the decode contexts
        grow), so only its iterations without a chunk repeat (`sim.steady.steady_steps`)."""
        return self.opts.auto_s is None

    def __post_init__(self) -> None:
        self.queue_order: QueueOrder = self.opts.queue_order()  # which waiting prompt starts next
        self.kv_limit: KVLimit | None = self.opts.kv_limit
        self._target = self.opts.auto_s
        if self._target is not None and self.cost is not None and not self.cost.pdsim_forms:
            raise PolicyError(f"budget {self.opts.budget}: the profile prices mlx-lm's calls only; an auto budget "
                              "prices pdsim's prefill and decode calls (calibrate without --engine mlx-lm)")

    def schedule(self, state: EngineState) -> list[Work]:
        o = self.opts
        ready = list(islice(state.ready, o.batch_size + 1))  # the slots, and whether one waits
        slots, blocked = ready[:o.batch_size], len(ready) > o.batch_size
        s = None
        if state.queued and not blocked:
            held = state.ready
            # tiny-llm: a request that waited for a slot takes it in an iteration with no prefill
            taking = o.order == "chunk-first" and any(held[r].generated == 1 and not held[r].req.prefilled
                                                       for r in slots)
            s = None if taking else self.queue_order.next(state)
        if s is not None and state.fits(s.rid):  # a KV limit admits it only when its cache fits
            return self._iteration(s, self._chunk(state, s, slots), slots)
        return self._iteration(None, 0, slots)

    def _iteration(self, s: RequestState | None, n: int, slots: list[str]) -> list[Work]:
        """The calls of an iteration that prefills n tokens of `s` (none if n is 0) and decodes the slots."""
        o = self.opts
        chunk: list[Work] = []
        if n:
            chunk = [Prefill(s.rid, n)]
            joins = o.order == "chunk-first" and n == s.prefill_left and s.owes_decode
            if joins and len(slots) < o.batch_size:
                slots = slots + [s.rid]
        decodes = o.decodes(slots)
        return chunk + decodes if o.order == "chunk-first" else decodes + chunk

    def _chunk(self, state: EngineState, s: RequestState, slots: list[str]) -> int:
        """Tokens of `s` to prefill this iteration: the budget, or all that is left when it is None or
        nothing decodes under idle_budget "whole", or the longest chunk that keeps the predicted
        iteration time within an `auto` target (at least 1)."""
        o, left = self.opts, s.prefill_left
        if o.budget is None or (o.idle_budget == "whole" and not state.ready):
            return left
        if self._target is None:
            return min(left, o.budget)
        if self.cost is None:
            raise PolicyError(f"budget {o.budget} needs a cost model to price its chunks: build the policy "
                              "with the run's profile (policies.make(..., cost=...))")
        memo: dict = {}
        host, target = host_seconds(self.cost), self._target
        return largest_fitting(
            lambda n: iteration_seconds(self.cost, state, self._iteration(s, n, slots), host, memo) <= target, left)


def eager(opts: Options) -> Chunked:
    return Chunked(Options(None, opts.batch_size, opts.decode, opts.order, kv_limit=opts.kv_limit, queue=opts.queue,
                           aging_s=opts.aging_s), "eager")
