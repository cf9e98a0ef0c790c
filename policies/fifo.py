"""fifo: one request at a time, its whole prefill then all its decodes (the meTile FIFO reference).

The next request to serve is the queue order's (`policies.queue`; arrival order by default).
It reads no budget: a prompt always prefills whole, as meTile's FIFO does."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policies.options import Options
from policies.queue import QueueOrder
from sim.engine.memory import KVLimit
from sim.engine.state import EngineState
from sim.engine.work import Prefill, Work


@dataclass
class Fifo:
    opts: Options = field(default_factory=Options)
    name: str = "fifo"
    engine: ClassVar[str] = "pdsim"
    steady: ClassVar[bool] = True
    queues_arrivals: ClassVar[bool] = True  # an arrival queues behind the waiting prompts (fcfs: `sim.steady.stretch_end`)
    steady_chunks: ClassVar[bool] = True

    def __post_init__(self) -> None:
        self.queue_order: QueueOrder = self.opts.queue_order()  # which waiting prompt starts next
        self.kv_limit: KVLimit | None = self.opts.kv_limit

    def schedule(self, state: EngineState) -> list[Work]:
        if state.ready:  # the one request in service is decoding
            return self.opts.decodes([next(iter(state.ready))])
        s = self.queue_order.next(state)  # alone, every request fits a KV limit (`sim.engine.kvlimit.check_kv_fit`)
        return [Prefill(s.rid, s.prefill_left)] if s is not None else []
