"""A measured log through today's state machine: what the state derives from a run's calls (KV
buffers written, fresh memory, the work each call was) recomputed at the measured times, so a
log written by an older pdsim, or by the real engine, is priced and scored by today's rules."""
from __future__ import annotations

from sim.engine.heap import Heap
from sim.engine.log import Call, EventLog
from sim.engine.memory import MemoryModel
from sim.engine.state import EngineState
from sim.engine.work import BatchPrefill, Decode, FirstForward, Generate, JoinPrompt, Mixed, Prefill, Work
from traces.trace import Trace


def relog(trace: Trace, log: EventLog, heap: Heap | None = None, memory: MemoryModel | None = None,
          counts: bool = True, state_tokens: int = 0) -> EventLog:
    """A measured log's calls through today's state machine, at their measured times: what the
    state derives from the calls (KV buffers written, fresh memory) recomputed with today's rules,
    for a log written before them. Single decodes need the log's `batched` flag (logs since 0.2).
    mlx-lm's calls are rebuilt as the work they were (`work_of`), their prompt-batch joins inferred.
    The measured peak memory and page faults are kept; with `memory`, the log's peak is that
    model's prediction for these very calls instead. `counts`: follow buffer sizes (a measured run's
    log; a replay's under a profile that prices no KV copy follows none: `RowsOnly`). `state_tokens`:
    a hybrid model's linear-layer state per request, which its syncs copy (`EngineState`)."""
    state = replayed(trace, log, heap, memory, counts, state_tokens)
    state.log.pipelined = log.pipelined
    if memory is None:
        state.log.peak_memory = log.peak_memory
    if log.faults is not None and len(log.faults) == state.log.call_count:  # measured, call for call
        state.log.faults, state.log.fault_bytes = list(log.faults), log.fault_bytes
    return state.log


def served(trace: Trace, log: EventLog, heap: Heap | None = None) -> Heap:
    """The process's heap after it made this log's calls, every cache dropped: what a warm-up that
    served the same trace left, where it took the path the log took."""
    return replayed(trace, log, heap).kv.released()


def replayed(trace: Trace, log: EventLog, heap: Heap | None = None, memory: MemoryModel | None = None,
             counts: bool = True, state_tokens: int = 0) -> EngineState:
    """The state machine after the log's calls, at their measured times (`relog`)."""
    state, sync = EngineState(trace, heap, memory=memory, counts=counts, state_tokens=state_tokens), None
    order = {r.id: i for i, r in enumerate(trace.requests)}
    prompting: dict[int, list[str]] = {}  # iteration -> the rows of its first forward and prompt calls
    for c in log.calls:
        if c.kind in ("first", "prompt"):
            prompting.setdefault(c.iteration, []).extend(c.rids)
    for c in log.calls:
        if c.kind == "sync":  # the rebuild before the next decode
            sync = c
            continue
        if c.kind == "preempt":
            state.admit(c.start)
            state.preempt(c.rids[0], c.start, c.iteration)
            continue
        start, synced = (sync.start, sync.end) if sync is not None else (c.start, None)
        state.admit(start)
        state.iteration = c.iteration
        if c.kind in ("first", "prompt"):  # BatchGenerator admits (FIFO) before either runs
            joining = sorted((r for r in prompting.pop(c.iteration, ()) if r not in state.kv.prompt.rows),
                             key=order.get)
            if joining:
                state.apply(JoinPrompt(tuple(joining)), start, start)
        state.apply(work_of(c), start, c.end, synced)
        sync = None
    return state


def work_of(c: Call) -> Work:
    """The work a logged call ran (a sync is part of the decode after it)."""
    if c.kind == "prefill":
        return Prefill(c.rids[0], c.tokens)
    if c.kind == "prompt":
        return BatchPrefill(tuple(zip(c.rids, c.chunks)))
    if c.kind == "first":
        return FirstForward(c.rids)
    if c.kind == "generate":
        return Generate(c.rids)
    if c.kind == "mixed":
        return Mixed(tuple(zip(c.rids, c.chunks)))
    return Decode(c.rids, c.batched)
