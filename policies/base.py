"""What a policy is: a small object that looks at the engine state and names the next work.

A policy never sleeps, times or touches MLX, so the same object drives the simulator and the real
engine, and a spot check compares like with like.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from policies.queue import DEFAULT_AGING_S, QUEUES, QueueOrder
from sim.engine.memory import KVLimit
from sim.engine.state import EngineState
from sim.engine.work import Decode, Work


class PolicyError(ValueError):
    """Bad policy name or parameter; the message says which and why."""


class Policy(Protocol):
    name: str
    # True promises: when `schedule` returns decodes and chunks that do not complete a prompt, it
    # returns the same work (same requests, same chunk sizes) next iteration, unless a request
    # arrived or finished, or one of the decodes is a request's first. The replay then prices a
    # whole stretch at once (`sim.steady`). A policy whose chunk sizes change between such
    # iterations (an `auto:MS` budget) sets `steady_chunks = False`: only its iterations without a
    # chunk are then priced as stretches.
    steady: bool

    def schedule(self, state: EngineState) -> list[Work]:
        """The calls of the next iteration, in order; [] when there is nothing to do now."""


@dataclass(frozen=True)
class Options:
    """The knobs the seeds' loops differ in, shared by every policy."""
    # prompt tokens per iteration (prefill_max_step); None = whole prompt; "auto:MS": the longest
    # chunk whose predicted iteration time is at most MS milliseconds (`policies.budget`)
    budget: int | str | None = None
    batch_size: int = 4  # maximum number of requests decoding at once
    decode: str = "batched"  # "batched": one call for all; "single": one call per request (meTile)
    order: str = "chunk-first"  # "chunk-first" (tiny-llm) or "decode-first" (meTile chunked)
    idle_budget: str = "budget"  # "whole": the whole prompt when no request is decoding (`policies.budget`)
    # the KV cache every request's together may hold (None: no limit); the engine state enforces it
    # (`sim.engine.kvlimit`), a policy only asks `state.fits` before it admits a request to prefill
    kv_limit: KVLimit | None = None
    queue: str = "fcfs"  # which waiting prompt starts next: "fcfs", "sjf", "priority" (`policies.queue`)
    aging_s: float = DEFAULT_AGING_S  # sjf, priority: a request waiting longer is served first, oldest first

    def __post_init__(self) -> None:
        from policies.budget import check_idle_budget, parse_budget
        object.__setattr__(self, "budget", parse_budget(self.budget))
        object.__setattr__(self, "idle_budget", check_idle_budget(self.idle_budget))
        if self.batch_size < 1:
            raise PolicyError(f"batch size must be >= 1, got {self.batch_size}")
        if self.decode not in ("batched", "single"):
            raise PolicyError(f"decode must be 'batched' or 'single', got {self.decode!r}")
        if self.order not in ("chunk-first", "decode-first"):
            raise PolicyError(f"order must be 'chunk-first' or 'decode-first', got {self.order!r}")
        if self.queue not in QUEUES:
            raise PolicyError(f"queue must be one of {', '.join(QUEUES)}, got {self.queue!r}")
        if isinstance(self.aging_s, bool) or not isinstance(self.aging_s, (int, float)) \
                or not (math.isfinite(self.aging_s) and self.aging_s > 0):
            raise PolicyError(f"aging_s must be a finite number of seconds > 0, got {self.aging_s!r}")

    def queue_order(self) -> QueueOrder:
        """What picks the next prompt in this queue order (`policies.queue`): one per policy object."""
        return QueueOrder(self.queue, self.aging_s)

    @property
    def auto_s(self) -> float | None:
        """The target of an `auto:MS` budget in seconds; None for a fixed budget or whole prompts."""
        from policies.budget import auto_target
        return auto_target(self.budget)

    def decodes(self, rids: list[str]) -> list[Work]:
        """One batched call, or one call per request."""
        if not rids:
            return []
        if self.decode == "batched":
            return [Decode(tuple(rids), True)]
        return [Decode((rid,), False) for rid in rids]
