"""The event log: every engine call with its start and end, every token with its time.

The simulator and the real engine write the same log, and `sim.metrics.scoring` scores it, so a predicted
run and a measured run are compared by one piece of code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat
from operator import sub
from typing import Iterable, NamedTuple

import numpy as np


class Call(NamedTuple):
    """One engine call. A named tuple: a long replay makes millions, and tuples are cheap to build."""
    # "prefill", "decode", or "sync" (the batch cache rebuilt before a decode: `EngineState.apply`);
    # "preempt": the KV limit freed a request's cache (no model call, start == end; `tokens` the
    # tokens freed, to be recomputed: `EngineState.preempt`);
    # mlx-lm's BatchGenerator: "prompt" (the prompt batch's chunks), "first" (first forwards),
    # "generate" (a step of the generation batch), see `sim.engine.work`
    kind: str
    start: float
    end: float
    rids: tuple[str, ...]
    tokens: int  # prefill: chunk length; prompt: the longest chunk (every row's length, padded); decode: batch size
    prefix: int = 0  # prefill: tokens already in the request's cache; prompt: the batch cache's write position
    contexts: tuple[int, ...] = ()  # decode: each request's context length for this step; prompt: each row's cached tokens
    joined: int = 0  # sync (or a decode in logs before syncs were calls): requests that joined / left the batch cache
    left: int = 0
    iteration: int = 0
    written: int = 0  # token-rows of KV buffer the call allocated and filled (`sim.engine.kvcache`)
    batched: bool = True  # decode: one call on the batch cache, or on the request's own cache
    fresh: int = 0  # of `written`, token-rows in fresh memory (beyond what the process freed: `sim.engine.kvcache`)
    chunks: tuple[int, ...] = ()  # prompt: each row's chunk (real tokens)


DECODE_KINDS = ("decode", "generate", "mixed")  # columns that return a token to each of their requests (a
# stretch's mixed forwards are decodes only: `sim.steady`)


@dataclass(frozen=True)
class RequestInfo:
    rid: str
    arrival: float
    prompt_len: int
    output_len: int
    prefilled: bool = False


class Column(NamedTuple):
    """One call of a stretch's iteration, through all its iterations."""
    kind: str
    rids: tuple[str, ...]
    tokens: int
    first: int | list[int]  # prefill: the first chunk's prefix; decode: the first call's contexts
    starts: list[float]
    ends: list[float]
    written: int = 0  # at the first iteration only: no buffer grows later in a stretch
    batched: bool = True
    fresh: int = 0  # at the first iteration only


class Stretch(NamedTuple):
    """The calls of identical iterations (`sim.steady`) as columns, one per call of the iteration.

    A long replay is mostly such stretches; keeping them as arrays lets a sweep score a run
    without building millions of `Call`s. `EventLog.calls` builds them when someone reads them.
    """
    columns: tuple[Column, ...]
    iteration: int  # of the first iteration

    def __len__(self) -> int:
        return len(self.columns) * len(self.columns[0].ends)

    def calls(self) -> Iterable[Call]:
        its = range(self.iteration, self.iteration + len(self.columns[0].ends))
        built = []
        for kind, rids, tokens, first, starts, ends, written, batched, fresh in self.columns:
            steps = len(ends)
            if kind == "prefill":
                prefixes, contexts = range(first, first + steps * tokens, tokens), repeat(())
            else:
                prefixes, contexts = repeat(0), zip(*(range(c, c + steps) for c in first))
            chunks = repeat((1,) * len(rids) if kind == "mixed" else ())  # a mixed column: decode rows
            built.append(map(_make_call, zip(repeat(kind), starts, ends, repeat(rids),
                                             repeat(tokens), prefixes, contexts, repeat(0), repeat(0), its,
                                             chain((written,), repeat(0)),
                                             repeat(batched), chain((fresh,), repeat(0)), chunks)))
        return built[0] if len(built) == 1 else chain.from_iterable(zip(*built))


_make_call = partial(tuple.__new__, Call)  # Call._make without its Python-level checks


@dataclass
class EventLog:
    requests: dict[str, RequestInfo] = field(default_factory=dict)
    tokens: dict[str, list[float]] = field(default_factory=dict)  # emission times per request
    _parts: list = field(default_factory=lambda: [[]], repr=False)  # lists of Calls and Stretches, in time order
    # bytes in use at the run's peak: predicted by the profile's memory model (`sim.engine.memory`) in a
    # simulated run, measured (`mx.get_peak_memory`) in a real one; None: not known
    peak_memory: float | None = None
    # a real run's minor page faults in each call, in the order of `calls` (`calibrate.engine.executor`):
    # fresh memory as the kernel counted it, beside `Call.fresh`, the state machine's estimate of
    # it (a join that faulted 160 MB ran 0.49 s where its copy is priced at 63 ms); None: not counted
    faults: list[int] | None = None
    fault_bytes: int = 4096  # the page a fault maps on the host that counted them (every log before it: Linux, x86)
    # a real mlx-lm run timed as the server runs it: next() overlapping host and device, each call's
    # span from its start on the host to the next one's (`sim.engine.pipeline`), not its own time
    pipelined: bool = False
    host_parts: dict[str, float] | None = None  # a real mlx-lm run's median host part by call kind (the same)
    queue_tails: dict[str, float] | None = None  # and, synchronized, its calls' time left when queued

    def add(self, call: Call) -> None:
        self._parts[-1].append(call)

    def done(self, rid: str) -> None:
        """Request `rid` emitted its last token (pdsim's and vLLM's calls; the state says so). A
        log that keeps every call needs nothing; one that tallies requests as they end does."""

    def add_stretch(self, stretch: Stretch) -> None:
        self._parts += [stretch, []]

    @property
    def calls(self) -> list[Call]:
        """Every call in time order (stretches are built into `Call`s on first reading)."""
        if len(self._parts) > 1:
            calls: list[Call] = []
            for part in self._parts:
                calls.extend(part if isinstance(part, list) else part.calls())
            self._parts = [calls]
        return self._parts[0]

    @property
    def call_count(self) -> int:
        return sum(map(len, self._parts))

    def preemptions(self) -> tuple[int, int]:
        """(preemptions, tokens their caches held, recomputed later): the "preempt" calls (never in
        a stretch: a stretch's iterations fit the KV limit)."""
        n = tokens = 0
        for part in self._parts:
            if isinstance(part, list):
                for c in part:
                    if c.kind == "preempt":
                        n += 1
                        tokens += c.tokens
        return n, tokens

    def busy_seconds(self) -> float:
        """Time the engine spent in calls (host overhead between calls excluded)."""
        busy = 0.0
        for part in self._parts:
            if isinstance(part, list):
                busy += sum(c.end - c.start for c in part)
            else:
                busy += sum(sum(map(sub, col.ends, col.starts)) for col in part.columns)
        return busy

    def decode_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """End times and iterations of every decode call (not sorted), without building
        stretches' `Call`s. An mlx-lm generation step completes when its `next()` returns its
        tokens: at the end of its iteration's last call (`sim.engine.work.Generate`)."""
        ends: list[float] = []
        its: list[int] = []
        for part in self._parts:
            if isinstance(part, list):
                last = {}
                for c in part:
                    if c.kind == "decode" or (c.kind == "mixed" and c.batched):
                        ends.append(c.end)
                        its.append(c.iteration)
                    elif c.kind == "generate":
                        last[c.iteration] = len(ends)
                        ends.append(c.end)
                        its.append(c.iteration)
                    if c.iteration in last:
                        ends[last[c.iteration]] = c.end
            else:
                for col in part.columns:
                    if col.kind in DECODE_KINDS:
                        ends += col.ends
                        its += range(part.iteration, part.iteration + len(col.ends))
        return np.array(ends, float), np.array(its, int)

    def to_dict(self) -> dict:
        return {
            "requests": [vars(r) for r in self.requests.values()],
            "calls": [[c.kind, c.start, c.end, list(c.rids), c.tokens, c.prefix, list(c.contexts),
                       c.joined, c.left, c.iteration, c.written, c.batched, c.fresh]
                      + ([list(c.chunks)] if c.chunks else []) for c in self.calls],
            "call_fields": list(Call._fields),
            "tokens": self.tokens,
            **({"peak_memory": self.peak_memory} if self.peak_memory is not None else {}),
            **({"faults": self.faults, "fault_bytes": self.fault_bytes} if self.faults is not None else {}),
            **({"pipelined": True} if self.pipelined else {}),
            **({"host_parts": self.host_parts} if self.host_parts else {}),
            **({"queue_tails": self.queue_tails} if self.queue_tails else {}),
        }

    @staticmethod
    def from_dict(d: dict) -> "EventLog":
        log = EventLog()
        for r in d["requests"]:
            log.requests[r["rid"]] = RequestInfo(**r)
        for k, s, e, rids, n, pre, ctx, *rest in d["calls"]:  # logs before `written` have 10 fields
            if len(rest) == 7:  # a prompt call's chunks
                rest[6] = tuple(rest[6])
            log.add(Call(k, s, e, tuple(rids), n, pre, tuple(ctx), *rest))
        log.tokens = {k: list(v) for k, v in d["tokens"].items()}
        log.peak_memory = d.get("peak_memory")
        log.faults = d.get("faults")
        log.fault_bytes = d.get("fault_bytes", 4096)
        log.pipelined = bool(d.get("pipelined", False))
        log.host_parts = d.get("host_parts")
        log.queue_tails = d.get("queue_tails")
        return log
