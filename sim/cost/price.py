"""The price of an engine call: where a call's time is computed, for the replay, for a policy
pricing a candidate chunk, and for a logged call being scored.

`call_costs` reads a call's shapes off the engine state as it stands before the call (chunk and
prefix, each row's context, the batch cache's joins and leaves, and the KV token-rows the call
writes and how many of them are fresh memory: `EngineState.kv_rows`), and `price` turns a
shape into seconds: the cost model's form for the call's kind (`sim.cost.model`, mlx-lm's calls
`sim.cost.mlxlm`) plus its KV copies (`sim.cost.copies`). A logged call carries the same
shape, so a measured run is priced by the same function (`sim.metrics.residuals.price_call`).
"""
from __future__ import annotations

from sim.cost.copies import call_copies
from sim.cost.mlxlm import MLX_KINDS
from sim.cost.model import CostModel
from sim.engine.state import EngineState
from sim.engine.work import BatchPrefill, Decode, FirstForward, Generate, JoinPrompt, Mixed, Prefill, Work


def price(cost: CostModel, kind: str, tokens: int, prefix: int, contexts, batched: bool, joined: int, left: int,
          written: int, fresh: int, chunks=()) -> float:
    """Seconds the cost model gives a call of this shape: the one pricing both executors' calls
    share, whether the call is about to run (`sim.cost.price.call_costs`) or was logged (`price_call`).
    A sync (the batch cache rebuilt) is its copies and a constant per join or leave; a mixed
    forward its rows (`chunks`, each after its `contexts`) and its own caches' growth."""
    copies = written or fresh  # none where the profile prices no KV (`sim.engine.kvcache.RowsOnly`)
    if kind == "mixed":
        return (call_copies(cost, "prefill", 0, 0, written, fresh) if copies else 0.0) + cost.mixed(chunks, contexts)
    if kind in MLX_KINDS:
        return cost.mlx_lm_call(kind, tokens, prefix, contexts, written, fresh)
    if kind == "preempt":  # a cache dropped: no model call (its recompute is a prefill, priced as one)
        return 0.0
    t = call_copies(cost, kind, joined, left, written, fresh, not batched) if copies else 0.0
    if kind == "prefill":
        return t + cost.prefill(tokens, prefix)
    if joined or left:  # a sync call, or a decode with its sync inside (logs from before syncs were calls)
        t += cost.membership(joined, left, contexts)
    return t if kind == "sync" else t + cost.decode(contexts, not batched)


def call_costs(cost: CostModel, state: EngineState, work: Work, rows=None) -> tuple[float, float]:
    """Seconds that `work` takes on the modelled engine, from the shapes the state gives it, priced
    as its logged calls would be (`sim.cost.price.price`): the batch cache's rebuild first (0 unless
    requests join or leave it), then the call itself. `rows`: `state.kv_rows(work)`, if known."""
    try:
        if isinstance(work, JoinPrompt):
            return 0.0, 0.0  # no model call (`sim.engine.work.JoinPrompt`)
        (sync_written, sync_fresh), (written, fresh) = rows or state.kv_rows(work)
        if type(work) is Decode:  # the commonest call first
            return _decode_costs(cost, state, work, sync_written, sync_fresh, written, fresh)
        if isinstance(work, Mixed):
            chunks, prefixes, _ = state.mixed_shape(work)
            return 0.0, price(cost, "mixed", sum(chunks), 0, prefixes, True, 0, 0, written, fresh, chunks)
        if isinstance(work, BatchPrefill):
            contexts = [state.queued[r].prefilled for r, _ in work.rows]
            return 0.0, price(cost, "prompt", max(n for _, n in work.rows), state.kv.prompt.idx, contexts, True, 0, 0,
                              written, fresh)
        if isinstance(work, (FirstForward, Generate)):
            kind, states = ("first", state.queued) if isinstance(work, FirstForward) else ("generate", state.ready)
            contexts = [states[r].req.prompt_len if kind == "first" else states[r].context for r in work.rids]
            return 0.0, price(cost, kind, len(contexts), 0, contexts, True, 0, 0, written, fresh)
        if isinstance(work, Prefill):
            return 0.0, price(cost, "prefill", work.tokens, state.queued[work.rid].prefilled, (), True, 0, 0,
                              written, fresh)
        return _decode_costs(cost, state, work, sync_written, sync_fresh, written, fresh)
    except (KeyError, AttributeError):
        state.check(work)  # raises EngineError saying what the policy got wrong
        raise


def _decode_costs(cost: CostModel, state: EngineState, work: Decode, sync_written: int, sync_fresh: int,
                  written: int, fresh: int) -> tuple[float, float]:
    ready = state.ready
    contexts = [ready[rid].context for rid in work.rids]
    joined, left = state.batch_change(work)
    sync = price(cost, "sync", len(contexts), 0, contexts, True, joined, left, sync_written, sync_fresh) \
        if joined or left else 0.0
    return sync, price(cost, "decode", len(contexts), 0, contexts, work.batched, 0, 0, written, fresh)


def host_seconds(cost: CostModel, engine: str = "pdsim") -> float:
    """Host work before an iteration's first call, as the replay charges it."""
    return cost.overhead(engine)


def iteration_seconds(cost: CostModel, state: EngineState, work: list[Work], host: float,
                      memo: dict | None = None) -> float:
    """What the replay would charge for the iteration `work` if it ran next: `host` then every
    call, each priced after the ones before it ran (`call_costs`). An `auto` budget compares
    candidate chunks with it (`policies.budget`), so a chunk the simulator runs costs what the
    policy predicted. Calls that allocate no array and complete no prompt change nothing another
    call's price reads (a chunk writes its own cache, a decode the batch's; an array, even in
    freed memory, moves where the next one lands: `sim.engine.heap`), so each is
    priced on the state as it is, once (`memo`: prices by call, for the candidates of one
    iteration); otherwise the iteration is followed on a scratch copy (`EngineState.what_if`)."""
    memo = {} if memo is None else memo
    completes = any(isinstance(w, Prefill) and w.tokens == state.queued[w.rid].prefill_left for w in work)
    if not completes or len(work) == 1:
        total, moved = host, False
        for w in work:
            got = memo.get(w)
            if got is None:
                rows = state.kv_rows(w)
                allocates = rows[0][0] + rows[1][0] > 0 or (isinstance(w, Decode) and state.batch_change(w) != (0, 0))
                got = memo[w] = (sum(call_costs(cost, state, w, rows)), allocates)
            total += got[0]
            moved = moved or got[1]
        if not moved or len(work) == 1:
            return total
    scratch, t = state.what_if(work), host
    for w in work:
        sync, seconds = call_costs(cost, scratch, w)
        scratch.apply(w, scratch.now, scratch.now + (sync + seconds), scratch.now + sync)
        t += sync + seconds
    return t
