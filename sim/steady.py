"""Pricing engine calls: one at a time (`call_costs`), or a steady stretch of identical
iterations priced and logged in one step.

Between arrivals, a policy asks for the same work iteration after iteration: the same decodes
until one of those requests finishes, and, with a chunk budget, the same-size chunk of the same
prompt until the chunk that completes it. Replaying that one call at a time is most of a long
replay (every output token and every chunk is an engine call). Here a whole stretch is priced with
vectorized cost-model calls and written to the log in bulk; the log is exactly the one the
call-by-call replay writes (a hypothesis test checks this), only faster to get.

It applies only to policies that declare `steady = True` (see `policies.base.Policy`).
"""
from __future__ import annotations

import sys
from bisect import bisect_left
from itertools import accumulate, chain

from sim.cost.model import CostModel
from sim.cost.price import call_costs
from sim.engine.batchcache import write
from sim.engine.pipeline import KIND, Pipeline
from sim.engine.state import EngineState
from sim.engine.work import BatchPrefill, Decode, FirstForward, Generate, JoinPrompt, Mixed, Prefill, Work


def steady_steps(policy, state: EngineState, work: list[Work]) -> int:
    """How many iterations of `work` could run back to back if nothing arrived; < 2 = not worth it.

    The stretch ends with the iteration in which the first of its requests emits its last token,
    and before the chunk that would complete a prompt (the policy may then do something else), or
    before a KV buffer would grow after the first iteration (`sim.engine.kvcache`: that call copies).
    At most one batched decode, on the batch cache's rows as they are, and no request twice.
    """
    if not policy.steady:
        return 0
    types = set(map(type, work))  # work items are plain named tuples: no subclasses
    if Decode in types and sum(1 for w in work if type(w) is Decode and w.batched) > 1:
        return 0
    if Prefill in types and not policy.steady_chunks:
        return 0  # its chunks change from one iteration to the next (an `auto` budget)
    if not types <= PDSIM_WORK:
        if types & MLX_LM_WORK:
            return _generate_steps(state, work)
        return _mixed_steps(state, work)
    steps, seen, ready = None, set(), state.ready
    for w in work:
        if type(w) is Prefill:
            s = state.queued.get(w.rid)
            if s is None or w.rid in seen or w.tokens < 1:
                return 0  # let the call-by-call path report the policy's mistake
            n = (s.prefill_left - 1) // w.tokens  # full chunks that leave the prompt unfinished
            n = min(n, _room(state, state.kv.own.get(w.rid, 0), s.prefilled, w.tokens))
            seen.add(w.rid)
        else:
            if not w.rids:
                return 0
            n = sys.maxsize
            for rid in w.rids:
                r = ready.get(rid)
                if r is None or r.generated == 1 or rid in seen:
                    return 0  # (a request's first decode: it may have just taken its slot, see `Policy.steady`)
                left = r.req.output_len - r.generated
                if left < n:
                    n = left
            if w.batched:
                n = min(n, _batch_room(state, w))
            else:
                n = min([n] + [_room(state, state.kv.own.get(r, 0), state.ready[r].context - 1, 1) for r in w.rids])
            seen.update(w.rids)
        steps = n if steps is None else min(steps, n)
    if steps and state.kv_limit is not None:  # the iterations whose tokens fit the KV limit (`sim.engine.kvlimit`)
        held = state.kv_held()
        grows = state.kv_after(work) - held
        if grows:
            steps = min(steps, (state.kv_limit - held) // grows)
    return steps or 0


PDSIM_WORK = frozenset((Prefill, Decode))
MLX_LM_WORK = frozenset((JoinPrompt, BatchPrefill, FirstForward, Generate))


def stretch_end(policy, state: EngineState) -> float | None:
    """Where a stretch must stop: the next arrival, or sooner the moment the policy's queue order
    may pick another prompt with nothing arrived (`policies.queue.QueueOrder.reorders_at`). Behind
    a waiting prompt in a first-come-first-served queue an arrival changes nothing the policy does
    (`Policy.queues_arrivals`): the stretch runs on, and the engine admits the arrivals after it,
    in their order, as it would have between its iterations."""
    order = policy.queue_order
    if state.queued and policy.queues_arrivals and (order is None or order.queue == "fcfs"):
        return None
    ends = [t for t in (state.next_arrival, order.reorders_at(state) if order else None) if t is not None]
    return min(ends, default=None)


def _generate_steps(state: EngineState, work: list[Work]) -> int:
    """mlx-lm: an iteration that is one step of the generation batch, on the rows of its last step
    (nothing joined or left: no rebuild owed), repeats until the first of them returns its last
    token (or the one before, if a request waits: the row leaving makes room for it in that same
    iteration), or the batch's buffer would grow after the first step; other iterations run one by one."""
    if len(work) != 1 or not isinstance(work[0], Generate) or work[0].rids != state.stepped or state.kv.gen.owed:
        return 0
    ready = state.ready
    n = min(ready[r].output_left for r in work[0].rids) - (len(state.queued) > 0)
    return min(n, _fits(state.kv.gen.cap, state.kv.gen.idx, 1))


def _mixed_steps(state: EngineState, work: list[Work]) -> int:
    """vLLM's: a forward of decode rows only, with no request waiting (it might be admitted),
    repeats until the first row's last token, or before a row's buffer would grow after the
    first forward, or where the KV limit stops it; forwards with prompt rows run one by one."""
    if len(work) != 1 or state.queued or any(rid not in state.ready or n != 1 for rid, n in work[0].rows):
        return 0
    ready = state.ready
    n = min(ready[rid].output_left for rid, _ in work[0].rows)
    n = min([n] + [_room(state, state.kv.own.get(rid, 0), ready[rid].context - 1, 1) for rid, _ in work[0].rows])
    if state.kv_limit is not None:
        n = min(n, (state.kv_limit - state.kv_held()) // len(work[0].rows))
    return n


def _batch_room(state: EngineState, w: Decode) -> int:
    """`_room` of the batch cache for a stretch of `w`. Its first step may rebuild the cache if rows
    only left it (a finished request's row goes at the next decode): a filter, which moves both
    ends by the padding the kept rows share. A join (a request's first decode, or one back from
    preemption) rebuilds it call by call."""
    kv = state.kv
    cap, idx = kv.cap, kv.idx
    if w.rids != kv.rows:
        if state.batch_change(w)[0] or not set(w.rids) < set(kv.rows):
            return 0
        if kv.counts:
            shift = idx - max(state.ready[r].context - 1 for r in w.rids)
            cap, idx = cap - shift, idx - shift
    return _room(state, cap, idx, 1)


def _room(state: EngineState, cap: int, idx: int, n: int) -> int:
    """`_fits`, where the state follows buffer sizes; without them (`RowsOnly`) no growth ends a stretch."""
    return _fits(cap, idx, n) if state.kv.counts else sys.maxsize


def _fits(cap: int, idx: int, n: int) -> int:
    """Iterations of n-token writes from `idx` in which no buffer grows after the first (>= 1)."""
    cap = write(cap, idx, n)[0]  # the first may grow it
    return max(1, 1 + (cap - idx - n) // n)


def steady_times(cost: CostModel, state: EngineState, work: list[Work], steps: int, t0: float,
                 end: float | None, overhead: float | None = None, pipe: Pipeline | None = None
                 ) -> tuple[list[list[float]], list[list[float]], list[float | None]] | None:
    """Start and end of every call of the stretch: `starts[i][j]` for call i of iteration j, and
    for each call of the first iteration, when its sync ended if it rebuilds the batch cache.

    The stretch stops before the first iteration that would start at or after `end` (the next
    arrival: the engine admits arrivals between iterations; `stretch_end`). Times are summed call by call in the same
    order and with the same operations as the call-by-call replay, so both give the same floats.
    None if a cost is negative (the call-by-call path reports that). `pipe`: mlx-lm's next()
    pipelined (`sim.engine.pipeline`; its stretches are one generation step an iteration).
    """
    columns, syncs = [], []
    for w in work:
        if isinstance(w, Generate):
            costs = cost.generate_steps([state.ready[rid].context for rid in w.rids], steps).tolist()
        elif isinstance(w, Mixed):
            costs = cost.mixed_steps(state.mixed_shape(w)[1], steps).tolist()
        elif isinstance(w, Prefill):
            costs = cost.prefill_steps(w.tokens, state.queued[w.rid].prefilled, steps).tolist()
        else:
            costs = cost.decode_steps([state.ready[rid].context for rid in w.rids], steps, not w.batched).tolist()
        rebuilds = type(w) is Decode and state.batch_change(w) != (0, 0)  # a sync first (`_batch_room`)
        sync = 0.0
        if rebuilds or state.kv.counts or type(w) not in PDSIM_WORK:  # else no growth: the column's own price
            sync, costs[0] = call_costs(cost, state, w)  # the same first call, with any buffer growth
        if rebuilds:
            costs[0] = sync + costs[0]
        syncs.append(sync if rebuilds else None)
        columns.append(costs)
    if min(map(min, columns)) < 0:
        return None
    n, overhead = len(columns), cost.iteration if overhead is None else overhead
    if pipe is not None:
        return _pipelined(pipe, work[0], columns[0], t0, overhead, end, state)
    columns[0] = [overhead + c for c in columns[0]]  # host work before each iteration's first call
    clock = list(accumulate(chain.from_iterable(zip(*columns)) if n > 1 else columns[0], initial=t0))  # call k's turn
    if end is not None:  # iteration j starts at clock[j * n]; keep those before the end
        steps = -(-bisect_left(clock, end, n, steps * n) // n)
    starts = [clock[i:steps * n:n] for i in range(n)]
    starts[0] = [t + overhead for t in starts[0]]
    synced = [None if sync is None else clock[i] + ((overhead if i == 0 else 0.0) + sync) for i, sync in enumerate(syncs)]
    return starts, [clock[i + 1:steps * n + 1:n] for i in range(n)], synced


def _pipelined(pipe: Pipeline, w: Work, costs: list[float], t: float, overhead: float, end: float | None,
               state: EngineState) -> tuple[list[list[float]], list[list[float]], list[float | None]]:
    """`steady_times` of one generation step an iteration on mlx-lm's pipeline: step by step, with
    the call-by-call replay's operations, so both give the same floats (rows leave after the step
    in which the first of them gets its last token, at the earliest the stretch's last)."""
    kind, last = KIND[type(w)], min(state.ready[r].output_left for r in w.rids) - 1
    starts, ends = [], []
    for j, c in enumerate(costs):
        if j and end is not None and t >= end:
            break
        starts.append(t + overhead)
        t = pipe.call(kind, t + overhead, c, j == last)
        ends.append(t)
    return [starts], [ends], [None]
