"""The real engine: runs a policy's work on MLX, on the same engine state machine as the simulator.

The loop is the simulator's, with the wall clock instead of a cost model: admit what has arrived,
ask the policy, run each call, hand the state its start and end times. Times are taken with
`time.perf_counter()` after the step functions have evaluated their results; the run's peak
memory is MLX's own count (`mx.get_peak_memory`, reset when the run starts, less the arrays the
process held besides the weights), what `sim.engine.memory` predicts, kept as the log's `peak_memory`.
Each call's minor page faults are counted too (`EventLog.faults`): fresh memory is where a join's
time goes when the allocator has given its pages back, which no shape says.
mlx-lm's calls (the mlx-lm policy) run on mlx-lm's own batch classes (`calibrate.engine.mlxlm_batches`).
"""
from __future__ import annotations

import random
import resource
import time
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.utils import maybe_set_recommended_wired_limit

from calibrate.engine.kernels import Cache, DecodeBatch, decode_one, new_cache, prefill_chunk
from calibrate.engine.mixed import mixed_forward
from calibrate.engine.model import LoadedModel, reset_peak
from policies.base import Policy
from sim.engine.heap import Heap
from sim.engine.kvlimit import kv_limit_of, next_work
from sim.engine.log import EventLog
from sim.engine.memory import kv_bytes_per_token, state_tokens
from sim.engine.requests import Freed
from sim.engine.state import EngineState
from sim.engine.work import BatchPrefill, Decode, EngineError, FirstForward, Generate, JoinPrompt, Mixed, Prefill, Work
from traces.trace import Request, Trace


def minor_faults() -> int:
    """The process's minor page faults so far, every thread's: pages the kernel mapped fresh."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def add_faults(log: EventLog, before: int, counts: list[int]) -> None:
    """Page faults for the calls logged since the log held `before` calls: `counts` on the last
    of them, 0 on any before those and on calls logged earlier without counts (preemptions)."""
    added = log.call_count - before
    log.faults += [0] * (before - len(log.faults))
    if added > 0:
        counts = counts[-added:]
        log.faults += [0] * (added - len(counts)) + counts


def prompt_tokens(req: Request, vocab: int) -> list[int]:
    """The request's prompt ids, folded into the model's vocabulary; made up (seeded by id) if absent."""
    if req.prompt_ids is not None:
        return [t % vocab for t in req.prompt_ids]
    rng = random.Random(f"prompt:{req.id}")
    return [rng.randrange(min(256, vocab - 1), vocab) for _ in range(req.prompt_len)]


@dataclass
class RealRun:
    log: EventLog
    outputs: dict[str, list[int]]  # greedy token ids per request
    idle_s: float = 0.0  # time spent waiting for arrivals
    inserted: dict[str, int] = field(default_factory=dict)  # request -> the iteration it was first seen before


@dataclass
class RealEngine:
    lm: LoadedModel
    caches: dict[str, Cache] = field(default_factory=dict)
    # the process's heap as earlier runs left it (`sim.engine.kvcache`): what its log's fresh rows
    # count (a confirm relogs a run with its profile's heap model before pricing it)
    heap: Heap = field(default_factory=Heap)
    kv_capacity: int | None = None  # the device's KV tokens, as the profile predicts them (`sim.engine.kvlimit.kv_limit_of`)

    def run(self, trace: Trace, policy: Policy, on_call=None) -> RealRun:
        """Serve `trace` under `policy` in real time; requests arrive at their trace times. The
        wired limit is what mlx-lm's BatchGenerator sets (Metal's recommended working set; no
        change elsewhere), so both engines run with the same memory kept resident."""
        old = maybe_set_recommended_wired_limit()
        try:
            return self._serve(trace, policy, on_call)
        finally:
            if old is not None:
                mx.synchronize()
                mx.set_wired_limit(old)

    def _serve(self, trace: Trace, policy: Policy, on_call=None) -> RealRun:
        limit = kv_limit_of(policy, kv_bytes_per_token(self.lm.config, self.lm.dtype), self.kv_capacity)
        state = EngineState(trace, self.heap, kv_limit=limit, state_tokens=state_tokens(self.lm.config, self.lm.dtype))
        self.caches, self.batch = {}, DecodeBatch(self.lm)
        self.mlx = None
        if policy.engine == "mlx-lm":
            from calibrate.engine.mlxlm_batches import MlxLmBatches
            self.mlx = MlxLmBatches(self.lm, policy.prefill_step)
        self.prompts = {r.id: prompt_tokens(r, self.lm.vocab_size) for r in trace.requests}
        self.outputs: dict[str, list[int]] = {r.id: [] for r in trace.requests}
        foreign = reset_peak(self.lm)  # this run's peak: the weights, the caches it builds, its calls' temporaries
        for r in trace.requests:  # prefilled requests: prefill and first token before the clock
            if r.prefilled:
                self.caches[r.id] = new_cache(self.lm)
                self.outputs[r.id].append(prefill_chunk(self.lm, self.caches[r.id], self.prompts[r.id])[0])
        idle, t0 = 0.0, time.perf_counter()
        clock = lambda: time.perf_counter() - t0
        state.log.faults, state.log.fault_bytes = [], resource.getpagesize()
        while not state.done:
            state.admit(clock())
            work = next_work(policy, state, clock(), self._free)
            if not work:
                nxt = state.next_arrival
                if nxt is None:
                    raise EngineError(f"policy {policy.name!r} returned no work with requests unserved")
                wait = max(0.0, nxt - clock())
                time.sleep(wait)
                idle += wait
                continue
            state.iteration += 1
            for item in work:
                state.check(item)
                before, faults, start = state.log.call_count, minor_faults(), clock()
                synced = self._run(item, state, clock)
                state.apply(item, start, clock(), synced)
                self._count_faults(state.log, before, faults, synced is not None)
                self._free_finished(item, state)
                if on_call:
                    on_call(state)
        self.heap = state.kv.released()
        add_faults(state.log, state.log.call_count, [])  # calls logged after the last item
        state.log.peak_memory = float(mx.get_peak_memory() - foreign)
        return RealRun(state.log, self.outputs, idle)

    def _run(self, work: Work, state: EngineState, clock) -> float | None:
        """Run one call; for a batched decode, the clock when the batch cache's sync ended."""
        if isinstance(work, Mixed):
            self._run_mixed(work, state)
            return None
        if not isinstance(work, (Prefill, Decode)):
            self._run_mlx_lm(work, state)
            return None
        if isinstance(work, Prefill):
            s = state.queued[work.rid]
            cache = self.caches.setdefault(work.rid, new_cache(self.lm))
            seq = self.prompts[work.rid]
            if s.generated:  # a recompute after a preemption: the prompt, then the outputs but the last
                seq = seq + self.outputs[work.rid][:s.generated - 1]
            token, _ = prefill_chunk(self.lm, cache, seq[s.prefilled:s.prefilled + work.tokens])
            if work.tokens == s.prefill_left and not s.generated:  # the last chunk gives the first token
                self.outputs[work.rid].append(token)
            return None
        assert isinstance(work, Decode)
        last = [self.outputs[rid][-1] for rid in work.rids]
        synced = None
        if work.batched:
            self.batch.sync(list(work.rids), self.caches)
            synced, self.sync_faults = clock(), minor_faults()
            tokens = self.batch.step(last)
        else:
            if any(rid in self.batch.ids for rid in work.rids):  # take it out of the batch cache first
                self.batch.sync([r for r in self.batch.ids if r not in work.rids], self.caches)
            tokens = [decode_one(self.lm, self.caches[rid], tok) for rid, tok in zip(work.rids, last)]
        for rid, tok in zip(work.rids, tokens):
            self.outputs[rid].append(tok)
        return synced

    def _run_mixed(self, work: Mixed, state: EngineState) -> None:
        """vLLM's one forward (`calibrate.engine.mixed`): each row's tokens on its own cache; a row
        that completes a prompt (not a recompute) gives the first token, a decode row the next."""
        rows, emits = [], []
        for rid, n in work.rows:
            if rid in state.ready:
                rows.append([self.outputs[rid][-1]])
                emits.append(True)
                continue
            s = state.queued[rid]
            seq = self.prompts[rid] + (self.outputs[rid][:s.generated - 1] if s.generated else [])
            rows.append(seq[s.prefilled:s.prefilled + n])
            emits.append(n == s.prefill_left and not s.generated)
        caches = [self.caches.setdefault(rid, new_cache(self.lm)) for rid, _ in work.rows]
        for (rid, _), emit, (token, _) in zip(work.rows, emits, mixed_forward(self.lm, caches, rows)):
            if emit:
                self.outputs[rid].append(token)

    def _count_faults(self, log: EventLog, before: int, faults: int, synced: bool) -> None:
        """The faults of the calls an item just logged: a sync's and its step's apart (the state
        logs the sync only when rows changed), the rest on the item's last call."""
        now = minor_faults()
        split = synced and log.call_count - before == 2
        add_faults(log, before, [self.sync_faults - faults, now - self.sync_faults] if split else [now - faults])

    def _run_mlx_lm(self, work: Work, state: EngineState) -> None:
        """An mlx-lm call on mlx-lm's batches; a generation step's tokens are the outputs."""
        if isinstance(work, JoinPrompt):
            self.mlx.join(list(work.rids), [state.queued[r].req.output_len for r in work.rids])
        elif isinstance(work, BatchPrefill):
            self.mlx.prefill([self.prompts[r][state.queued[r].prefilled:state.queued[r].prefilled + n]
                              for r, n in work.rows])
        elif isinstance(work, FirstForward):
            self.mlx.first_forward(list(work.rids), [self.prompts[r][-1] for r in work.rids])
        else:
            assert isinstance(work, Generate)
            for rid, token in self.mlx.generate():
                self.outputs[rid].append(token)

    def _free(self, rid: str) -> None:
        """A preemption (`sim.engine.kvlimit`): drop the request's own cache now; its row in the batch
        cache is marked freed, and the batch's next sync filters it out (a leave), as the state's
        KV model follows it (`sim.engine.kvcache.KVBuffers.preempt`)."""
        self.caches.pop(rid, None)
        if rid in self.batch.ids:
            self.batch.ids[self.batch.ids.index(rid)] = Freed(rid)

    def _free_finished(self, work: Work, state: EngineState) -> None:
        """Drop finished requests' own caches (the batch filters them out at its next change)."""
        if not isinstance(work, (Prefill, Decode, Mixed)):
            return
        rids = (work.rid,) if isinstance(work, Prefill) else tuple(r for r, _ in work.rows) \
            if isinstance(work, Mixed) else work.rids
        for rid in rids:
            if rid not in state.queued and rid not in state.ready:
                self.caches.pop(rid, None)
