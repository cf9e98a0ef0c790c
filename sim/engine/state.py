"""The engine state machine shared by the simulator and the real engine.

It admits arrivals, checks and applies each call a policy asked for, tracks every request's
progress and writes the event log. It never decides anything (policies do) and never measures
time (executors hand it start and end times).
"""
from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import replace

from sim.engine.heap import Heap, NoHeap
from sim.engine.kvcache import KVBuffers, RowsOnly, write
from sim.engine.kvlimit import KVLimitRules, check_kv_fit
from sim.engine.log import Call, Column, EventLog, RequestInfo, Stretch
from sim.engine.memory import MemoryModel, PeakMemory
from sim.engine.mixed import MixedForward
from sim.engine.mlxlm import MlxLmTransitions
from sim.engine.requests import RequestState
from sim.engine.work import BatchPrefill, Decode, EngineError, FirstForward, Generate, JoinPrompt, Mixed, Prefill, Work
from traces.trace import Trace

Rows = tuple[int, int]  # (written, fresh) token-rows of KV buffer
NONE: Rows = (0, 0)


class EngineState(KVLimitRules, MlxLmTransitions, MixedForward):
    """What the engine holds: requests queued for prefill, requests ready to decode, the log.

    `queued` holds arrived requests whose prefill is not finished, in arrival order; `ready` holds
    requests whose prefill is done and which still owe tokens, in order of prefill completion.
    Policies read both (and `now`) and must not modify them. mlx-lm's engine keeps the requests
    it prefills together in its prompt batch (`prompt_rows`, a part of `queued`) and its
    generation batch is `ready`, in the batch's order.
    """

    def __init__(self, trace: Trace, heap: Heap | NoHeap | None = None, log: EventLog | None = None,
                 memory: MemoryModel | None = None, kv_limit: int | None = None, counts: bool = True,
                 state_tokens: int = 0):
        """`heap`: the process's heap as this run finds it (after its warm-up: `sim.engine.heap`);
        `log`: where calls and tokens go (default a new `EventLog`; `sim.metrics.scored_log.ScoredLog`
        tallies a long run instead of keeping it); `memory`: the profile's memory model, whose
        largest call peak goes to the log as `peak_memory` (`sim.engine.memory`; None: not priced);
        `kv_limit`: the KV-cache tokens every cache together may hold (None: no limit;
        `sim.engine.kvlimit` enforces it); `state_tokens`: a hybrid model's linear-layer state per
        request, in KV tokens, which the limit counts and a sync copies (`sim.engine.memory.state_tokens`)."""
        if kv_limit is not None:
            check_kv_fit(trace, kv_limit, state_tokens)
        self.kv_limit = kv_limit
        self.state_tokens = state_tokens
        self.kv_used = 0  # tokens in every KV cache now (pdsim's engine; mlx-lm's calls are not counted)
        self.trace = trace
        self.now = 0.0
        self.iteration = 0
        # arrival order, and the head read every iteration: an OrderedDict, since a plain dict's
        # first item is found by skipping every entry deleted before it (on a week-long trace whose
        # queue holds a million requests, most of the replay's time)
        self.queued: OrderedDict[str, RequestState] = OrderedDict()
        self.ready: dict[str, RequestState] = {}
        # the KV caches' buffers and the batch's rows; their sizes only where a price reads them (`counts`)
        self.kv = (KVBuffers if counts else RowsOnly)(heap=(heap or Heap()).copy(), state=state_tokens)
        self.finished = 0
        self.arrived = 0
        self.log = EventLog() if log is None else log
        self._returned: tuple[int, list[list[float]]] = (-1, [])  # a `Generate`'s tokens: iteration, lists
        self.stepped: tuple[str, ...] = ()  # mlx-lm: the generation batch's rows at its last step
        self.memory = PeakMemory(memory) if memory is not None else None
        self._position: dict[str, int] | None = None  # arrival order (the trace's), built at a first preemption
        self.preempted_in = -1  # the last iteration a preemption was logged in (`sim.engine.kvlimit`)
        self._followed: tuple | None = None  # (work, buffers after it, rows): `kv_rows`'s copy, for `apply`
        for r in trace.requests:
            self.log.requests[r.id] = RequestInfo(r.id, r.arrival, r.prompt_len, r.output_len, r.prefilled)
            self.log.tokens[r.id] = []

    @property
    def done(self) -> bool:
        return self.finished == len(self.trace.requests)

    @property
    def next_arrival(self) -> float | None:
        """Arrival time of the next request not yet admitted, or None."""
        reqs = self.trace.requests
        return reqs[self.arrived].arrival if self.arrived < len(reqs) else None

    def admit(self, upto: float) -> int:
        """Admit every request that has arrived by time `upto`; return how many. The clock (`now`)
        moves to `upto`: a policy deciding after an idle wait sees the time it decides at."""
        if upto > self.now:
            self.now = upto
        reqs, n = self.trace.requests, 0
        while self.arrived < len(reqs) and reqs[self.arrived].arrival <= upto:
            r = reqs[self.arrived]
            s = RequestState(r)
            if r.prefilled:  # prefill and first token happened before the clock started
                s.prefilled, s.generated = r.prompt_len, 1
                self.kv.prefill(r.id, 0, r.prompt_len)
                self.kv_used += r.prompt_len
                self.log.tokens[r.id].append(r.arrival)
                self.ready[r.id] = s
            else:
                self.queued[r.id] = s
            self.arrived += 1
            n += 1
        return n

    def batch_change(self, work: Decode) -> tuple[int, int]:
        """How many requests join and leave the batch cache if `work` runs next."""
        if not work.batched or work.rids == self.kv.rows:
            return 0, 0
        new, old = set(work.rids), set(self.kv.rows)
        return len(new - old), len(old - new)

    def kv_rows(self, work: Work) -> tuple[Rows, Rows]:
        """Token-rows of KV buffer `work` would allocate and fill if it ran next, and how many of
        them are fresh memory (`sim.engine.kvcache`): (written, fresh) of the batch cache's rebuild (the
        sync: (0, 0) unless requests join or leave) and of the call itself."""
        kv = self.kv
        if not kv.counts and isinstance(work, (Prefill, Decode, Mixed)):
            return NONE, NONE  # sizes not followed: nothing a price reads (`RowsOnly`)
        if isinstance(work, Prefill):
            prefix = self.queued[work.rid].prefilled
            if not _grown(kv.own.get(work.rid, 0), prefix, work.tokens):
                return NONE, NONE  # no array: nothing written, nothing faulted (pending frees fault nothing)
            return self._follow(work, prefix)
        if isinstance(work, Decode) and work.batched and work.rids == kv.rows \
                and not _grown(kv.cap, kv.idx, 1):
            return NONE, NONE
        if isinstance(work, Mixed):
            _, prefixes, _ = self.mixed_shape(work)
            if not any(_grown(kv.own.get(r, 0), p, n) for (r, n), p in zip(work.rows, prefixes)):
                return NONE, NONE
        return self._follow(work, 0)  # a growth, a batch change, single decodes, mlx-lm's

    def _follow(self, work: Work, prefix: int) -> tuple[Rows, Rows]:
        """`work` followed on a copy of the buffers; if `work` runs next, `apply` keeps the copy
        (placing arrays on the heap model is most of a replay's time: done once, not twice)."""
        kv = self.kv.what_if()
        rows = self._kv_apply(work, prefix, kv)
        self._followed = (work, kv, rows)
        return rows

    def what_if(self, work: list[Work]) -> "EngineState":
        """A scratch copy to follow pdsim's `work` on without changing this state: the requests it
        names and the batch cache's rows copied, the KV buffers copied, a log that keeps nothing
        (`sim.cost.price.iteration_seconds` prices an iteration on it)."""
        named = set(self.kv.rows)
        for w in work:
            named.update((w.rid,) if isinstance(w, Prefill) else w.rids)
        s = EngineState.__new__(EngineState)
        s.trace, s.now, s.iteration, s.arrived, s.finished = self.trace, self.now, self.iteration, self.arrived, 0
        s.queued = OrderedDict((r, replace(self.queued[r])) for r in named if r in self.queued)
        s.ready = {r: replace(st) for r, st in self.ready.items() if r in named}
        s.kv, s.log = self.kv.what_if(), _NoLog()
        s._returned, s.stepped = (-1, []), self.stepped
        s.memory, s.kv_limit, s.kv_used, s._position = None, self.kv_limit, self.kv_used, self._position
        s.state_tokens, s.preempted_in, s._followed = self.state_tokens, self.preempted_in, None
        return s

    def cached(self, rids) -> dict[str, int]:
        """Tokens each request's cache holds before its next decode (all but its last token)."""
        return {r: self.ready[r].context - 1 for r in set(rids) | set(self.kv.rows) if r in self.ready}

    def _kv_apply(self, work: Work, prefix: int, kv: KVBuffers | None = None) -> tuple[Rows, Rows]:
        """Follow the buffers through `work`; the (written, fresh) token-rows of its sync and its call."""
        if kv is None:
            followed, self._followed = self._followed, None
            if followed is not None and followed[0] is work:
                self.kv = followed[1]
                return followed[2]
        kv = kv or self.kv
        if type(work) is Decode and work.batched:  # the commonest call first
            return kv.decode_batch(work.rids, self.cached(work.rids) if kv.counts else {})
        if isinstance(work, Prefill):
            return NONE, kv.prefill(work.rid, prefix, work.tokens)
        if isinstance(work, BatchPrefill):
            return NONE, kv.batch_prefill([n for _, n in work.rows])
        if isinstance(work, FirstForward):
            return NONE, kv.first_forward(work.rids)
        if isinstance(work, Generate):
            return NONE, kv.generate(work.rids, {r for r in work.rids if self.ready[r].output_left == 1})
        if isinstance(work, JoinPrompt):
            return NONE, kv.join_prompt(work.rids)
        if isinstance(work, Mixed):
            _, prefixes, _ = self.mixed_shape(work)
            return NONE, kv.mixed([(r, p, n) for (r, n), p in zip(work.rows, prefixes)])
        if not work.batched:
            rows = [kv.decode_one(r, self.ready[r].context - 1) for r in work.rids]
            return NONE, (sum(w for w, _ in rows), sum(f for _, f in rows))
        return kv.decode_batch(work.rids, self.cached(work.rids) if kv.counts else {})

    def check(self, work: Work) -> None:
        """Raise EngineError if `work` cannot run now."""
        if isinstance(work, Prefill):
            s = self.queued.get(work.rid)
            if s is None:
                raise EngineError(f"prefill of {work.rid!r}: not queued (not arrived, or already prefilled)")
            if not 1 <= work.tokens <= s.prefill_left:
                raise EngineError(f"prefill of {work.rid!r}: {work.tokens} tokens, {s.prefill_left} left")
        elif isinstance(work, Decode):
            if not work.rids:
                raise EngineError("decode with no requests")
            if len(set(work.rids)) != len(work.rids):
                raise EngineError(f"decode lists a request twice: {work.rids}")
            for rid in work.rids:
                if rid not in self.ready:
                    raise EngineError(f"decode of {rid!r}: its prefill has not finished, or it is done")
                if self.ready[rid].pipelined:
                    raise EngineError(f"decode of {rid!r}: it is in mlx-lm's generation batch (Generate)")
        elif isinstance(work, Mixed):
            self._check_mixed(work)
        else:
            self._check_mlx_lm(work)

    def apply(self, work: Work, start: float, end: float, synced: float | None = None) -> None:
        """Record that `work` ran from `start` to `end`, and advance the requests it touched.

        A batched decode whose rows change first rebuilds the batch cache (`DecodeBatch.sync`):
        `synced` is when that ended, and the log keeps the rebuild as a call of its own (kind
        "sync", with the requests that joined and left), so its copies are timed and priced apart
        from the step. Without `synced` (logs from before) the decode call holds both."""
        if start < self.now or end < start:
            raise EngineError(f"time went backwards: call [{start}, {end}] after {self.now}")
        self.now = end
        tokens = self.log.tokens
        if isinstance(work, Mixed):
            self._apply_mixed(work, start, end)
            return
        if not isinstance(work, (Prefill, Decode)):
            self._apply_mlx_lm(work, start, end)
            return
        if isinstance(work, Prefill):
            self.check(work)
            s = self.queued[work.rid]
            held = self.kv.resident() if self.memory is not None else 0
            _, (written, fresh) = self._kv_apply(work, s.prefilled)
            if self.memory is not None:
                self._peak(held, self._grown(held), "prefill", work.tokens, s.prefilled, ())
            self.log.add(Call("prefill", start, end, (work.rid,), work.tokens, s.prefilled,
                              iteration=self.iteration, written=written, fresh=fresh))
            s.prefilled += work.tokens
            self.kv_used += work.tokens
            if s.prefill_left == 0:
                del self.queued[work.rid]
                if s.generated:  # a recompute after a preemption: no token, it decodes on
                    self.ready[work.rid] = s
                    return
                s.generated = 1
                tokens[work.rid].append(end)
                self._ready_or_finish(s)
            return
        rids = work.rids if isinstance(work, Decode) else ()
        if not rids or (len(rids) > 1 and len(set(rids)) != len(rids)):
            self.check(work)  # raises EngineError saying what is wrong
        try:
            states = [self.ready[rid] for rid in work.rids]
        except KeyError:
            self.check(work)  # raises EngineError naming the request
            raise
        joined, left = self.batch_change(work)
        held = self.kv.resident() if self.memory is not None else 0
        (sync_written, sync_fresh), (written, fresh) = self._kv_apply(work, 0)
        contexts = tuple([s.req.prompt_len + s.generated for s in states])
        if self.memory is not None:
            self._peak(held, self._grown(held), "decode", len(states), 0, contexts)
        if (joined or left) and synced is not None:  # the batch cache's rebuild, a call of its own
            if not start <= synced <= end:
                raise EngineError(f"sync ends at {synced}, outside its call [{start}, {end}]")
            self.log.add(Call("sync", start, synced, work.rids, len(work.rids), 0, contexts, joined, left,
                              self.iteration, sync_written, True, sync_fresh))
            start, joined, left = synced, 0, 0
        else:  # a log from before syncs were calls: the rebuild is inside the decode call
            written, fresh = written + sync_written, fresh + sync_fresh
        self.kv_used += len(states)
        for s in states:
            rid = s.req.id
            s.generated += 1
            tokens[rid].append(end)
            if s.generated == s.req.output_len:
                del self.ready[rid]
                self.kv.finish(rid)
                self.kv_used -= s.req.prompt_len + s.generated - 1
                self.finished += 1
                self.log.done(s.req.id)
        self.log.add(Call("decode", start, end, work.rids, len(work.rids), 0, contexts,
                          joined, left, self.iteration, written, work.batched, fresh))

    def apply_steady(self, work: list[Work], starts: list[list[float]], ends: list[list[float]],
                     synced: list[float | None] | None = None) -> None:
        """Record a stretch of identical iterations (`sim.steady`): call i of iteration j ran from
        `starts[i][j]` to `ends[i][j]`, the first iteration being `self.iteration`; the log `apply`
        writes call by call, as columns. No chunk in it completes a prompt. `synced[i]`: when call
        i's batch rebuild ended in the first iteration, which `apply` then records call by call."""
        if synced and any(t is not None for t in synced):
            for i, w in enumerate(work):
                self.apply(w, starts[i][0], ends[i][0], synced[i])
            if len(ends[0]) == 1:
                return
            self.iteration += 1
            starts, ends = [c[1:] for c in starts], [c[1:] for c in ends]
        self._followed = None
        steps, done = len(ends[0]), []
        if ends[0][0] < starts[0][0] or starts[0][0] < self.now:
            raise EngineError(f"time went backwards: call [{starts[0][0]}, {ends[0][0]}] after {self.now}")
        columns = []
        for w, begin, end in zip(work, starts, ends):
            held = self.kv.resident() if self.memory is not None else 0
            if isinstance(w, Generate):  # mlx-lm: only steps of an unchanged batch (sim.steady)
                columns.append(self._steady_generate(w, steps, begin, end, held))
                continue
            if isinstance(w, Mixed):  # vLLM's: only forwards of the same decode rows (sim.steady)
                columns.append(self._steady_mixed(w, steps, begin, end, held))
                continue
            if isinstance(w, Prefill):
                s = self.queued[w.rid]
                _, (written, fresh) = self._kv_apply(w, s.prefilled)  # the later chunks fit (sim.steady)
                if self.memory is not None:  # the first chunk allocates, the last holds that and attends the most
                    self._peak(held, self._grown(held), "prefill", w.tokens, s.prefilled, ())
                    self._peak(self.kv.resident(), 0, "prefill", w.tokens, s.prefilled + (steps - 1) * w.tokens, ())
                columns.append(Column("prefill", (w.rid,), w.tokens, s.prefilled, begin, end, written, True, fresh))
                s.prefilled += steps * w.tokens
                self.kv_used += steps * w.tokens
                continue
            states = [self.ready[rid] for rid in w.rids]
            if self.batch_change(w) != (0, 0):
                raise EngineError("a stretch's decode changes the batch's rows (sim.steady never asks for one)")
            _, (written, fresh) = self._kv_apply(w, 0)
            if self.memory is not None:  # the first step allocates, the last holds that and attends the most
                first = tuple(s.context for s in states)
                self._peak(held, self._grown(held), "decode", len(states), 0, first)
                self._peak(self.kv.resident(), 0, "decode", len(states), 0, tuple(c + steps - 1 for c in first))
            columns.append(Column("decode", w.rids, len(w.rids), [s.context for s in states], begin, end,
                                  written, w.batched, fresh))
            if w.batched:
                self.kv.idx += steps - 1
            self.kv_used += steps * len(states)
            for s in states:
                self.log.tokens[s.req.id].extend(end)
                s.generated += steps
                if s.generated == s.req.output_len:
                    del self.ready[s.req.id]
                    done.append(s.req.id)
                    self.kv_used -= s.req.prompt_len + s.generated - 1
                    self.finished += 1
                    self.log.done(s.req.id)
        for rid in done:  # at the stretch's last step: after every array its first step allocated
            self.kv.finish(rid)
        self.log.add_stretch(Stretch(tuple(columns), self.iteration))
        self.iteration += steps - 1
        self.now = ends[-1][-1]

    def _grown(self, held: int) -> int:
        """Token-rows of KV buffer a call just added to the `held` before it: what MLX's memory in use
        rose by (a buffer grown from 256 to 506 rows rises by 250, not by the 506 it copies)."""
        return max(0, self.kv.resident() - held)

    def _peak(self, held: int, grown: int, kind: str, tokens: int, prefix: int, contexts) -> None:
        """A call's peak memory into the run's (`sim.engine.memory`), and the run's so far onto the log.
        pdsim's calls pass what they added to the buffers (`_grown`); mlx-lm's lazy rebuilds pass
        the largest array they build: the old buffers stay alive through the call beside it, the
        pads before a concatenation do not (on qwen3-tiny, three BatchGenerator settings: run
        peaks 0.95-1.00x measured above the weights; the sum of the arrays priced them 1.7-2.3x,
        the net growth 0.73-0.89x)."""
        states = 0
        if self.memory.model.state:  # a hybrid model's linear-layer states (`sim.engine.memory`)
            kv = self.kv
            states = len(kv.prompt.rows) + len(kv.gen.rows) if kind in MLX_PEAK_KINDS else \
                len(self.ready) + sum(1 for q in self.queued.values() if q.prefilled) + len(kv.rows)
        self.memory.call(held, grown, kind, tokens, prefix, contexts, states)
        self.log.peak_memory = self.memory.peak

    def _ready_or_finish(self, s: RequestState) -> None:
        if s.output_left == 0:
            self.kv.finish(s.rid)
            self.kv_used -= s.prefilled
            self.finished += 1
            self.log.done(s.req.id)
        else:
            self.ready[s.rid] = s


class _NoLog:
    """The log of a scratch state (`EngineState.what_if`): takes calls and tokens, keeps nothing."""

    def __init__(self) -> None:
        self.tokens = defaultdict(list)

    def add(self, call: Call) -> None:
        pass

    def done(self, rid: str) -> None:
        pass


MLX_PEAK_KINDS = ("prompt", "first", "generate")  # mlx-lm's calls: its states live in its two batches only


def _grown(cap: int, idx: int, n: int) -> int:
    return write(cap, idx, n)[1]


