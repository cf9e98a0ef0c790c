"""Queue order: which waiting request a policy prefills next (`Options.queue`).

Every pdsim policy (fifo, eager, chunked) asks `next_prefill` instead of taking the oldest queued
request, so one option orders all three, in the simulator and on the real engine alike:

- `fcfs`: arrival order (what every policy did before the option existed);
- `sjf`: the shortest prompt first (ties in arrival order);
- `priority`: earliest deadline first, a request's deadline being its arrival plus its TTFT
  target (`Request.ttft_slo_ms`, its class's `--class-slo CLASS:ttft=MS`); a request with no
  target has no deadline and comes after every request that has one, in arrival order.

Why a started prefill is always finished first: a partly prefilled prompt holds its KV cache, and
switching to another would keep two partial caches resident; vLLM likewise schedules running
requests before waiting ones. So the order decides which prompt starts next, never interrupts
one. A request preempted by a KV limit (`sim.engine.kvlimit`) resumes before any prompt that has not
begun, in every order: it has emitted tokens already (a client mid-stream) and its recompute is
owed; vLLM's default scheduler likewise puts a preempted request back at the front of its
waiting queue. A prompt that does not fit the limit waits at the front; later prompts wait
behind it (no overtaking).

Why an aging bound (`aging_s`, seconds): sjf starves long prompts and priority starves requests
without a deadline while shorter or tighter ones keep arriving. A request that has waited
`aging_s` or longer is served first, in arrival order, before any younger one. The default, 30 s, lies
far above the TTFT of a loaded server on Apple silicon (seconds) and so leaves the order alone
until a request has clearly been passed over; on a slow CPU pass a larger bound.
"""
from __future__ import annotations

import heapq
import math
import weakref
from dataclasses import dataclass, field

from sim.engine.requests import RequestState
from sim.engine.state import EngineState

QUEUES = ("fcfs", "sjf", "priority")
DEFAULT_AGING_S = 30.0


def deadline(r) -> float:
    """A request's arrival plus its TTFT target, in seconds; infinite without a target."""
    return math.inf if r.ttft_slo_ms is None else r.arrival + r.ttft_slo_ms / 1e3


def prompt_len(r) -> int:
    return r.prompt_len


KEYS = {"sjf": prompt_len, "priority": deadline}


@dataclass
class QueueOrder:
    """Picks the next prompt for one policy object. The keys never change while a request waits
    (its prompt length, its deadline), so the waiting requests sit in a heap fed by the engine's
    admissions: a pick costs a logarithm of the queue, not a scan of it, on a long trace whose
    queue grows to thousands. The heap belongs to one run (one `EngineState`); a new run starts a
    new one. Deterministic: ties go to the earlier arrival."""
    queue: str = "fcfs"
    aging_s: float = DEFAULT_AGING_S
    _state: object = field(default=None, repr=False, compare=False)
    _heap: list = field(default_factory=list, repr=False, compare=False)
    _seen: int = field(default=0, repr=False, compare=False)
    _started: str | None = field(default=None, repr=False, compare=False)

    def next(self, state: EngineState) -> RequestState | None:
        """The queued request whose prefill runs next: a started prefill first, then a preempted
        request (`sim.engine.kvlimit`), then the oldest request if it has waited the aging bound or
        longer, then the queue's order."""
        queued = state.queued
        if not queued:
            return None
        head = next(iter(queued.values()))  # arrival order, after begun prefills and preempted requests
        if self.queue == "fcfs" or head.prefilled or head.preempted:
            return head
        if self._state is None or self._state() is not state:  # a new run
            self._state, self._heap, self._seen, self._started = weakref.ref(state), [], 0, None
        started = queued.get(self._started)
        if started is not None and started.prefilled:
            return started
        if state.now >= head.req.arrival + self.aging_s:
            chosen = head
        else:
            chosen = self._best(state)
        self._started = chosen.rid
        return chosen

    def reorders_at(self, state: EngineState) -> float | None:
        """When this order may pick another prompt with nothing arrived or served: the moment the
        oldest waiting request reaches the aging bound (None: fcfs, nothing waits, or it has
        reached it). A steady stretch (`sim.steady`) stops there as it does at an arrival."""
        if self.queue == "fcfs" or not state.queued:
            return None
        aged = next(iter(state.queued.values())).req.arrival + self.aging_s
        return aged if aged > state.now else None

    def _best(self, state: EngineState) -> RequestState:
        key, reqs, heap, queued = KEYS[self.queue], state.trace.requests, self._heap, state.queued
        while self._seen < state.arrived:  # the requests admitted since the last pick
            r = reqs[self._seen]
            if not r.prefilled:
                heapq.heappush(heap, (key(r), self._seen, r.id))
            self._seen += 1
        while heap[0][2] not in queued:  # prefilled since (served, or taken as the aged head)
            heapq.heappop(heap)
        return queued[heap[0][2]]
