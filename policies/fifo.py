"""fifo: one request at a time, its whole prefill then all its decodes (the meTile FIFO reference).

The next request to serve is the queue order's (`policies.queue`; arrival order by default)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import Options
from sim.engine.state import EngineState
from sim.engine.work import Prefill, Work


@dataclass
class Fifo:
    opts: Options = field(default_factory=Options)
    name: str = "fifo"
    steady: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.queue_order = self.opts.queue_order()  # which waiting prompt starts next

    def schedule(self, state: EngineState) -> list[Work]:
        if state.ready:  # the one request in service is decoding
            return self.opts.decodes([next(iter(state.ready))])
        s = self.queue_order.next(state)  # alone, every request fits a KV limit (`sim.engine.state.check_kv_fit`)
        if s is not None:
            return [Prefill(s.rid, min(s.prefill_left, self.opts.budget or s.prefill_left))]
        return []
