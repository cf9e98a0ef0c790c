"""The SimPy replay: arrivals as one process, the engine as another, time from a cost model.

One SimPy event per engine call (and one per arrival), never one per token, so a 10,000-request
trace replays in seconds.
"""
from __future__ import annotations

import simpy

from policies.base import Policy
from sim.costmodel import CostModel
from sim.log import EventLog
from sim.state import EngineError, EngineState
from sim.work import Prefill, Work
from traces.trace import Trace


def call_cost(cost: CostModel, state: EngineState, work: Work) -> float:
    """Seconds that `work` takes on the modelled engine, from the shapes the state gives it."""
    try:
        if isinstance(work, Prefill):
            return cost.prefill(work.tokens, state.queued[work.rid].prefilled)
        joined, left = state.batch_change(work)
        contexts = [state.ready[rid].context for rid in work.rids]
        t = cost.decode(contexts)
        return t + cost.membership(joined, left, contexts) if joined or left else t
    except (KeyError, AttributeError):
        state.check(work)  # raises EngineError saying what the policy got wrong
        raise


def simulate(trace: Trace, policy: Policy, cost: CostModel) -> EventLog:
    """Replay `trace` under `policy`; return the event log. Deterministic: no randomness inside."""
    env = simpy.Environment()
    state = EngineState(trace)
    wake = [env.event()]

    def arrivals():
        for r in trace.requests:
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            if not wake[0].triggered:
                wake[0].succeed()

    def engine():
        while not state.done:
            state.admit(env.now)
            work = policy.schedule(state)
            if not work:
                if state.next_arrival is None:
                    raise EngineError(f"policy {policy.name!r} returned no work with "
                                      f"{len(state.queued) + len(state.ready)} requests unserved")
                wake[0] = env.event()
                if state.next_arrival <= env.now:
                    wake[0].succeed()
                yield wake[0]
                continue
            state.iteration += 1
            overhead = cost.iteration  # host work before the iteration's first call
            for item in work:
                start = env.now + overhead
                yield env.timeout(overhead + call_cost(cost, state, item))
                state.apply(item, start, env.now)
                overhead = 0.0

    env.process(arrivals())
    proc = env.process(engine())
    env.run(until=proc)
    return state.log
