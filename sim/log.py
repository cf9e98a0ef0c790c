"""The event log: every engine call with its start and end, every token with its time.

The simulator and the real engine write the same log, and `sim.metrics` scores it, so a predicted
run and a measured run are compared by one piece of code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Call(NamedTuple):
    """One engine call. A named tuple: a long replay makes millions, and tuples are cheap to build."""
    kind: str  # "prefill" or "decode"
    start: float
    end: float
    rids: tuple[str, ...]
    tokens: int  # prefill: chunk length; decode: batch size
    prefix: int = 0  # prefill: tokens already in the request's cache
    contexts: tuple[int, ...] = ()  # decode: each request's context length for this step
    joined: int = 0  # decode: requests that joined / left the batch cache at this call
    left: int = 0
    iteration: int = 0


@dataclass(frozen=True)
class RequestInfo:
    rid: str
    arrival: float
    prompt_len: int
    output_len: int
    prefilled: bool = False


@dataclass
class EventLog:
    requests: dict[str, RequestInfo] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    tokens: dict[str, list[float]] = field(default_factory=dict)  # emission times per request

    def to_dict(self) -> dict:
        return {
            "requests": [vars(r) for r in self.requests.values()],
            "calls": [[c.kind, c.start, c.end, list(c.rids), c.tokens, c.prefix, list(c.contexts),
                       c.joined, c.left, c.iteration] for c in self.calls],
            "call_fields": ["kind", "start", "end", "rids", "tokens", "prefix", "contexts", "joined",
                            "left", "iteration"],
            "tokens": self.tokens,
        }

    @staticmethod
    def from_dict(d: dict) -> "EventLog":
        log = EventLog()
        for r in d["requests"]:
            log.requests[r["rid"]] = RequestInfo(**r)
        for k, s, e, rids, n, pre, ctx, j, lft, it in d["calls"]:
            log.calls.append(Call(k, s, e, tuple(rids), n, pre, tuple(ctx), j, lft, it))
        log.tokens = {k: list(v) for k, v in d["tokens"].items()}
        return log
