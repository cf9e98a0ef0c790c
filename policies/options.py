"""The options pdsim's own policies (fifo, eager, chunked) read, with their defaults: the only
copy of each default (`policies.settings` and the command line read them from here; mlx-lm's
own options and defaults are `policies.mlxlm.DEFAULTS`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from policies.base import PolicyError
from policies.budget import auto_target, check_idle_budget, parse_budget
from policies.queue import DEFAULT_AGING_S, QUEUES, QueueOrder
from sim.core.errors import InputError
from sim.engine.memory import KVLimit, parse_kv_limit
from sim.engine.work import Decode, Work


@dataclass(frozen=True)
class Options:
    """The knobs the seeds' loops differ in, shared by every pdsim policy."""
    # prompt tokens per iteration (prefill_max_step); None = whole prompt; "auto:MS": the longest
    # chunk whose predicted iteration time is at most MS milliseconds (`policies.budget`)
    budget: int | str | None = None
    batch_size: int = 4  # maximum number of requests decoding at once
    decode: str = "batched"  # "batched": one call for all; "single": one call per request (meTile)
    order: str = "chunk-first"  # "chunk-first" (tiny-llm) or "decode-first" (meTile chunked)
    idle_budget: str = "budget"  # "whole": the whole prompt when no request is decoding (`policies.budget`)
    # the KV cache every request's together may hold (None: no limit); the engine state enforces it
    # (`sim.engine.kvlimit`), a policy only asks `fits` before it admits a request to prefill
    kv_limit: KVLimit | None = None
    queue: str = "fcfs"  # which waiting prompt starts next: "fcfs", "sjf", "priority" (`policies.queue`)
    aging_s: float = DEFAULT_AGING_S  # sjf, priority: a request waiting longer is served first, oldest first

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", parse_budget(self.budget))
        object.__setattr__(self, "idle_budget", check_idle_budget(self.idle_budget))
        try:
            object.__setattr__(self, "kv_limit", parse_kv_limit(self.kv_limit))
        except InputError as e:
            raise PolicyError(str(e)) from None
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
        return auto_target(self.budget)

    def decodes(self, rids: list[str]) -> list[Work]:
        """One batched call, or one call per request."""
        if not rids:
            return []
        if self.decode == "batched":
            return [Decode(tuple(rids), True)]
        return [Decode((rid,), False) for rid in rids]


NAMES = tuple(f.name for f in fields(Options))
DEFAULTS = {f.name: f.default for f in fields(Options)}
