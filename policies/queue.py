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
requests before waiting ones. So the order decides which prompt starts next, never interrupts one.

Why an aging bound (`aging_s`, seconds): sjf starves long prompts and priority starves requests
without a deadline while shorter or tighter ones keep arriving. A request that has waited longer
than `aging_s` is served first, in arrival order, before any younger one. The default, 30 s, lies
far above the TTFT of a loaded server on Apple silicon (seconds) and so leaves the order alone
until a request has clearly been passed over; on a slow CPU pass a larger bound.
"""
from __future__ import annotations

import math

from sim.state import EngineState, RequestState

QUEUES = ("fcfs", "sjf", "priority")
DEFAULT_AGING_S = 30.0


def deadline(s: RequestState) -> float:
    """Arrival plus the request's TTFT target, in seconds; infinite without a target."""
    target = s.req.ttft_slo_ms
    return math.inf if target is None else s.req.arrival + target / 1e3


def prompt_len(s: RequestState) -> int:
    return s.req.prompt_len


KEYS = {"sjf": prompt_len, "priority": deadline}


def next_prefill(state: EngineState, queue: str, aging_s: float) -> RequestState | None:
    """The queued request whose prefill runs next under `queue`: a started prefill first, then any
    request older than the aging bound (the oldest), then the queue's order (ties: arrival)."""
    queued = state.queued
    if not queued:
        return None
    head = next(iter(queued.values()))  # `queued` is in arrival order
    if queue == "fcfs" or head.prefilled or state.now - head.req.arrival > aging_s:
        return head
    started = next((s for s in queued.values() if s.prefilled), None)
    if started is not None:
        return started
    return min(queued.values(), key=KEYS[queue])  # the first of equal keys: the oldest
