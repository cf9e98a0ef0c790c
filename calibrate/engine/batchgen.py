"""The second real engine: the installed mlx-lm's `BatchGenerator` itself, driven by a trace.

What `pdsim confirm --engine mlx-lm` runs, each run in a fresh process (`calibrate.measure.worker`):
every request is inserted when the wall clock passes its arrival (before the next `next()`),
`next()` is called in a loop, greedy (the generator's default sampler), EOS ignored (no stop
sequences: a bare BatchGenerator's default), each request's `max_tokens` its trace output
length. The generator runs on the default stream, as `mlx_lm.server` passes it.

Timing. `next()` makes up to three model calls (a generation step, a first forward, a prompt
call) and pipelines the step's forward into the next `next()`. The model handed to the generator
(`CallWatch`) reads the clock and notes each call's shape as the call starts, and when the host
has built and queued it (`mx.async_eval` returned; a prompt call: its graph built) the clock and
the thread's CPU time again. Two ways:
- synchronized (a calibration's engine runs): the stream is synchronized before each model call
  and at the end of every `next()`, so each call is timed on its own, from its start to the next
  one's (or to the end of `next()`), with the host work that follows it; the time before the first
  is host work between calls. The host's part of each kind of call (its CPU time to be queued)
  and what was left of it when queued are measured here (`EventLog.host_parts`, `queue_tails`).
- pipelined (`pdsim confirm`, as `mlx_lm.server` runs it): nothing is synchronized, so a call's
  graph is built while the device runs the ones before it, and a step's tokens are returned
  before its own forward has run. Each call's span is host time, from its start to the next
  one's; the simulator times its calls the same way (`sim.engine.pipeline`, `EventLog.pipelined`).

Shapes. Which requests stepped, which ran their first forward and which prompt chunks of which
lengths ran come from `next()`'s responses (uids, progress); the watched model calls give each
call's input shape and its cache's write position and capacity (Python-side values, nothing
evaluated). The calls go through pdsim's state machine as `sim.engine.work` calls at their measured
times, so the run is pdsim's event log, scored by the same metrics; the state's KV model must
agree with the shapes seen, and the mlx-lm policy, shown the same state before every `next()`,
must ask for exactly what the generator did, or the run says so (`RunCheck`).
"""
from __future__ import annotations

import resource
import statistics
import time
from dataclasses import dataclass, field

import mlx.core as mx

from calibrate.engine.executor import RealRun, add_faults, minor_faults, prompt_tokens
from calibrate.engine.kernels import first_kv
from calibrate.engine.mlxlm_batches import G
from calibrate.engine.model import LoadedModel, reset_peak
from policies.mlxlm import MlxLm
from sim.engine.heap import Heap
from sim.engine.memory import state_tokens
from sim.engine.state import EngineState
from sim.engine.work import BatchPrefill, FirstForward, Generate, JoinPrompt, Work
from traces.trace import Trace


@dataclass
class Seen:
    """One model call as the generator made it: its kind, input shape, cache position and capacity,
    start, the process's minor page faults at its start (`EventLog.faults`), and the host's part
    of it (`sim.engine.pipeline`)."""
    kind: str  # "generate", "first" or "prompt"
    rows: int
    tokens: int
    idx: int
    cap: int
    at: float
    faults: int
    cpu: float = 0.0  # the host thread's CPU time at its start
    built: float | None = None  # the host thread's CPU time building and queueing it (waits take none)
    queued: float | None = None  # seconds from its start to `mx.async_eval` returning


class CallWatch:
    """The model, as handed to BatchGenerator: every call goes to the real model unchanged; as it
    starts (the generator's stream synchronized first, if `synced`) the clock is read and the call's
    shape noted, and when the host has queued it (`queued`) the clock again. Which batch a call
    belongs to is told by its cache (the prompt batch's, the generation batch's, or neither: a
    first forward, on the rows just split off)."""

    def __init__(self, model, clock, synced: bool = True):
        self._model, self._clock, self.synced = model, clock, synced
        self.gen = None
        self.seen: list[Seen] = []

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, inputs, cache=None):
        g = self.gen
        if self.synced:
            mx.synchronize(g.stream)
        at = self._clock()
        kind = "prompt" if cache is g._prompt_batch.prompt_cache else \
            "generate" if cache is g._generation_batch.prompt_cache else "first"
        c = first_kv(cache)
        seen = Seen(kind, inputs.shape[0], inputs.shape[1], c._idx, c.keys.shape[2] if c.keys is not None else 0, at,
                    minor_faults(), time.thread_time())
        self.seen.append(seen)
        out = self._model(inputs, cache=cache)
        if kind == "prompt":  # evaluated at once (`PromptProcessingBatch.prompt`): its graph is its host part
            seen.built = time.thread_time() - seen.cpu
        return out

    def queued(self) -> None:
        """The generator's `mx.async_eval` returned: a step's or first forward's host part ends."""
        seen = self.seen[-1] if self.seen else None
        if seen is not None and seen.built is None:
            seen.built, seen.queued = time.thread_time() - seen.cpu, self._clock() - seen.at


def _watch_queue(watch: CallWatch):
    """Until the returned function is called, `mx.async_eval` (BatchGenerator calls it through
    `mx`) tells `watch` when it has queued a call."""
    real = mx.async_eval

    def async_eval(*args):
        real(*args)
        watch.queued()

    mx.async_eval = async_eval
    return lambda: setattr(mx, "async_eval", real)


@dataclass
class RunCheck:
    """What a driven run found against pdsim's model of BatchGenerator (empty lists: it agreed)."""
    policy_mismatches: list[str] = field(default_factory=list)  # iterations where the policy asked for other calls
    shape_mismatches: list[str] = field(default_factory=list)  # calls whose shape or cache the KV model missed

    @property
    def ok(self) -> bool:
        return not self.policy_mismatches and not self.shape_mismatches


def run_batch_generator(lm: LoadedModel, trace: Trace, setting: dict, heap: Heap | None = None,
                        on_call=None, pipelined: bool = False) -> tuple[RealRun, RunCheck, Heap]:
    """Serve `trace` with a fresh BatchGenerator under `setting` (the mlx-lm policy's options) in
    real time, synchronized or `pipelined` (see the module's docstring); the run (pdsim's log,
    greedy outputs), what it found, and the process's heap after it, as the state followed it
    (the next run's `heap`). `on_call(state, generator)` after every `next()`."""
    policy = MlxLm(**{k: v for k, v in setting.items() if k != "policy"})
    t0 = time.perf_counter()
    clock = lambda: time.perf_counter() - t0
    watch = CallWatch(lm.model, clock, synced=not pipelined)
    gen = G.BatchGenerator(watch, completion_batch_size=policy.decode_concurrency,
                           prefill_batch_size=policy.prompt_concurrency, prefill_step_size=policy.prefill_step,
                           stream=mx.default_stream(mx.default_device()))
    watch.gen = gen
    state, check = EngineState(trace, heap, state_tokens=state_tokens(lm.config, lm.dtype)), RunCheck()
    prompts = {r.id: prompt_tokens(r, lm.vocab_size) for r in trace.requests}
    outputs: dict[str, list[int]] = {r.id: [] for r in trace.requests}
    rid_of: dict[int, str] = {}
    done: dict[str, int] = {}  # prompt tokens each request has sent to prefill
    inserted: dict[str, int] = {}
    idle = 0.0
    foreign = reset_peak(lm)  # this run's peak, as pdsim's executor takes it (`sim.engine.memory` predicts it)
    state.log.faults, state.log.fault_bytes = [], resource.getpagesize()
    state.log.pipelined = pipelined
    built: dict[str, list[float]] = {}  # the host's part of each call, by kind
    tails: dict[str, list[float]] = {}  # what was left of each synchronized call when it was queued
    restore = _watch_queue(watch)
    try:
        while not state.done:
            before = state.arrived
            state.admit(clock())
            new = trace.requests[before:state.arrived]
            if new:
                uids = gen.insert([prompts[r.id] for r in new], max_tokens=[r.output_len for r in new])
                rid_of.update(zip(uids, (r.id for r in new)))
                inserted.update((r.id, state.iteration + 1) for r in new)
            if not state.queued and not state.ready:
                nxt = state.next_arrival
                wait = max(0.0, nxt - clock())
                time.sleep(wait)
                idle += wait
                continue
            state.iteration += 1
            asked = policy.schedule(state)
            watch.seen = []
            start, start_faults = clock(), minor_faults()
            prompt_out, gen_out = gen.next()
            if not pipelined:
                mx.synchronize(gen.stream)
            end, end_faults = clock(), minor_faults()
            for seen, after in zip(watch.seen, [x.at for x in watch.seen[1:]] + [end]):
                built.setdefault(seen.kind, []).append(seen.built)
                if seen.queued is not None and not pipelined:  # the call's device time left when queued
                    tails.setdefault(seen.kind, []).append(after - seen.at - seen.queued)
            work = _observed(state, prompt_out, gen_out, rid_of, done)
            if asked != work:
                check.policy_mismatches.append(f"iteration {state.iteration}: BatchGenerator ran {work}, "
                                               f"the policy asked for {asked}")
            _apply(state, work, watch.seen, (start, start_faults), (end, end_faults), check)
            for r in gen_out:
                outputs[rid_of[r.uid]].append(r.token)
                r.prompt_cache = None  # a finished row's extracted cache: lazy views nobody reads
            if on_call:
                on_call(state, gen)
    finally:
        restore()
        gen.close()
    state.log.peak_memory = float(mx.get_peak_memory() - foreign)
    add_faults(state.log, state.log.call_count, [])
    state.log.host_parts = {k: statistics.median(v) for k, v in built.items() if None not in v}
    state.log.queue_tails = {k: statistics.median(v) for k, v in tails.items()}
    return RealRun(state.log, outputs, idle, inserted), check, state.kv.released()


def _observed(state: EngineState, prompt_out, gen_out, rid_of: dict[int, str], done: dict[str, int]) -> list[Work]:
    """The calls one `next()` made, as pdsim's work, from its responses: the generation step's rows,
    the rows that ended their prompt (first forward), every other prompt row's chunk (its progress
    since the last call); the joins: rows of either not yet in the prompt batch, in insertion order."""
    work: list[Work] = []
    if gen_out:
        work.append(Generate(tuple(rid_of[r.uid] for r in gen_out)))
    first = tuple(rid_of[r.uid] for r in prompt_out if r.end_of_prompt)
    chunks = []
    for r in prompt_out:
        if not r.end_of_prompt:
            rid = rid_of[r.uid]
            chunks.append((rid, r.progress[0] - done.get(rid, 0)))
            done[rid] = r.progress[0]
    rows = set(state.prompt_rows)
    uid = {v: k for k, v in rid_of.items()}
    joining = sorted({r for r in first + tuple(r for r, _ in chunks) if r not in rows}, key=uid.get)
    if joining:
        work.append(JoinPrompt(tuple(joining)))
    if first:
        work.append(FirstForward(first))
    if chunks:
        work.append(BatchPrefill(tuple(chunks)))
    return work


def _apply(state: EngineState, work: list[Work], seen: list[Seen], start: tuple[float, int],
           end: tuple[float, int], check: RunCheck) -> None:
    """Hand the state machine the observed calls at their measured times: a model call lasts to the
    next one's start, the last to the end of `next()`; the joins take no time, before the first
    forward or prompt call. Each call's shape is checked against what the state expects, and its
    page faults are counted the same way (`start` and `end`: `next()`'s time and fault count)."""
    calls = [w for w in work if not isinstance(w, JoinPrompt)]
    kinds = {Generate: "generate", FirstForward: "first", BatchPrefill: "prompt"}
    if [kinds[type(w)] for w in calls] != [s.kind for s in seen]:
        check.shape_mismatches.append(f"iteration {state.iteration}: model calls {[s.kind for s in seen]}, "
                                      f"responses say {[kinds[type(w)] for w in calls]}")
        seen = [Seen(kinds[type(w)], 0, 0, 0, 0, *start) for w in calls]  # keep the log going, untimed
    marks, faults = [s.at for s in seen] + [end[0]], [s.faults for s in seen] + [end[1]]
    i = 0
    for w in work:
        before = state.log.call_count
        if isinstance(w, JoinPrompt):
            state.apply(w, marks[i], marks[i])
            add_faults(state.log, before, [])
            continue
        expected = _expected_shape(state, w)
        got = (seen[i].rows, seen[i].tokens, seen[i].idx, seen[i].cap)
        if got != expected:
            check.shape_mismatches.append(f"iteration {state.iteration} {seen[i].kind}: (rows, tokens, idx, cap) "
                                          f"{got}, pdsim's model {expected}")
        state.apply(w, marks[i], marks[i + 1])
        add_faults(state.log, before, [faults[i + 1] - faults[i]])
        i += 1


def _expected_shape(state: EngineState, w: Work) -> tuple[int, int, int, int]:
    """The model call's input shape and its cache's write position and capacity, by pdsim's KV
    model (`sim.engine.batchcache.BatchCache`), before the call writes."""
    kv = state.kv
    if isinstance(w, Generate):
        rows, tokens, c = len(w.rids), 1, kv.gen
    elif isinstance(w, FirstForward):
        rows, tokens, c = len(w.rids), 1, kv.prompt.copy().split([kv.prompt.rows.index(r) for r in w.rids])
    else:
        rows, tokens, c = len(w.rows), max(n for _, n in w.rows), kv.prompt
    return rows, tokens, c.idx, c.cap if c.keys else 0
