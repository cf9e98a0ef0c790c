"""The SimPy replay: the engine as a process, time from a cost model.

SimPy's clock moves with the engine's where something else happens: at an idle wait for the
next arrival, and at the end of an iteration after which arrivals are admitted. Between arrivals
nothing else happens, so the iterations there (priced one by one, or a steady stretch of identical
ones at a time: `sim.steady`) need no event of their own; never one per token, so a
10,000-request trace replays in seconds.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Callable, Iterator

import simpy

from policies.base import Policy
from sim.cost.fields import ProfileError
from sim.cost.model import CostModel
from sim.cost.price import call_costs
from sim.engine.heap import Heap, NoHeap
from sim.engine.kvlimit import kv_limit_of, next_work
from sim.engine.log import EventLog
from sim.engine.state import EngineState
from sim.engine.work import EngineError
from sim.steady import steady_steps, steady_times, stretch_end
from traces.trace import Trace


def simulate(trace: Trace, policy: Policy, cost: CostModel, steady: bool = True, warmup: Trace | None = None,
             log: EventLog | None = None, noise: Callable[[], float] | None = None) -> EventLog:
    """Replay `trace` under `policy`; return the event log. Deterministic: no randomness inside
    but `noise`'s.

    The engine is one SimPy process; arrivals are read from the trace between iterations, as a
    real engine sees them. The engine keeps the exact clock (`t`, each end the start plus the
    call's cost) and SimPy advances with it. `steady=False` turns off the bulk pricing of steady
    stretches (`sim.steady`), for checking that it changes nothing. `warmup`: a trace the same
    process served first (a confirm run's warm-up), whose KV arrays the allocator then reuses.
    `log`: where the run is logged (`sim.metrics.scored_log.ScoredLog` scores a long run in bounded memory).
    `noise`: a factor for every call's time (`sim.cost.noise.CallNoise.sampler`); it turns the steady
    stretches off, since every call then takes its own time.
    The cost model's memory model, if its profile has one, predicts the run's peak memory
    (`sim.engine.memory`, the log's `peak_memory`).
    """
    if policy.engine == "pdsim" and not cost.pdsim_forms:
        raise ProfileError(f"the profile prices mlx-lm's BatchGenerator only (`pdsim calibrate --engine mlx-lm`); "
                           f"policy {policy.name!r} runs on pdsim's engine: calibrate without --engine for it")
    limit = kv_limit_of(policy, cost.kv_bytes, cost.kv_capacity)
    heap = warmed(warmup, policy, cost) if warmup is not None else cost.fresh_heap()
    state = EngineState(trace, heap, log, cost.memory, limit, counts=cost.prices_kv, state_tokens=cost.state_tokens)
    _serve(state, policy, cost, steady and noise is None, noise)
    return state.log


def warmed(warmup: Trace, policy: Policy, cost: CostModel, heap: Heap | None = None) -> Heap | NoHeap:
    """The process's heap after serving `warmup`, every cache dropped (`sim.engine.kvcache`), from
    `heap` (a measured run's: every buffer followed), or the cost model's (`CostModel.fresh_heap`)."""
    state = EngineState(warmup, heap if heap is not None else cost.fresh_heap(),
                        kv_limit=kv_limit_of(policy, cost.kv_bytes, cost.kv_capacity),
                        counts=heap is not None or cost.prices_kv, state_tokens=cost.state_tokens)
    _serve(state, policy, cost, True)
    return state.kv.released()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the engine runs: the run's requests, calls and
    stretches all stay alive to the end, so every collection rescans them and frees nothing (with
    it on, eager bs8 on 10,000 Poisson requests took 1.9 s here, off 0.8 s); reference counting
    still frees what the run drops."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _serve(state: EngineState, policy: Policy, cost: CostModel, steady: bool,
           noise: Callable[[], float] | None = None) -> None:
    """The engine process over `state`'s trace, run to the end."""
    env = simpy.Environment()
    host = cost.overhead(policy.engine)
    pipe = cost.pipeline(policy.engine)  # mlx-lm's next() overlapping host and device (`sim.engine.pipeline`)
    state.log.pipelined = pipe is not None

    def until(when: float) -> simpy.Timeout:
        return env.timeout(max(0.0, when - env.now))  # SimPy's clock may trail `t` by a rounding

    def engine():
        t = 0.0
        while not state.done:
            state.admit(t)
            work = next_work(policy, state, t)
            if not work:
                if state.next_arrival is None:
                    raise EngineError(f"policy {policy.name!r} returned no work with "
                                      f"{len(state.queued) + len(state.ready)} requests unserved")
                yield until(state.next_arrival)
                t = max(t, state.next_arrival)
                continue
            state.iteration += 1
            steps = steady_steps(policy, state, work) if steady else 0
            times = steady_times(cost, state, work, steps, t, stretch_end(policy, state), host, pipe) \
                if steps > 1 else None
            if times is not None:
                state.apply_steady(work, *times)
                t = times[1][-1][-1]
            else:
                overhead = host  # host work before the iteration's first call
                for k, item in enumerate(work):
                    sync, seconds = call_costs(cost, state, item)
                    if noise is not None:
                        f = noise()
                        sync, seconds = sync * f, seconds * f
                    start, synced, end = t + overhead, t + (overhead + sync), t + (overhead + (sync + seconds))
                    if pipe is not None:
                        end = pipe.work(item, start, sync + seconds, state.ready, state.stepped, work[k + 1:])
                    state.apply(item, start, end, synced)
                    t, overhead = end, 0.0
            arrival = state.next_arrival
            if arrival is not None and arrival <= t:
                yield until(t)  # arrivals wait to be admitted: SimPy's clock catches up
        yield until(t)

    with _collector_paused():
        env.run(until=env.process(engine()))
