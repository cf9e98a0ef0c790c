"""What a policy is: a small object that looks at the engine state and names the next work.

A policy never sleeps, times or touches MLX, so the same object drives the simulator and the real
engine, and a spot check compares like with like. Every policy has every attribute of `Policy`:
the replay and the executors read them and never probe for them.
"""
from __future__ import annotations

from typing import Protocol

from policies.queue import QueueOrder
from sim.core.errors import InputError
from sim.engine.memory import KVLimit
from sim.engine.state import EngineState
from sim.engine.work import Work


class PolicyError(InputError):
    """Bad policy name or parameter; the message says which and why."""


class Policy(Protocol):
    name: str
    engine: str  # whose calls `schedule` returns: "pdsim" (its own engine) or "mlx-lm" (BatchGenerator's)
    # True promises: when `schedule` returns decodes and chunks that do not complete a prompt, it
    # returns the same work (same requests, same chunk sizes) next iteration, unless a request
    # arrived or finished, or one of the decodes is a request's first. The replay then prices a
    # whole stretch at once (`sim.steady`).
    steady: bool
    # False: its chunk sizes change between such iterations (an `auto:MS` budget), so only its
    # iterations without a chunk are priced as stretches.
    steady_chunks: bool
    # True promises: while a prompt waits in its queue, an arrival changes none of its work (it
    # queues behind, in arrival order), so a steady stretch runs on through arrivals (`sim.steady`).
    # It holds for a first-come-first-served queue only: another order may pick the newcomer.
    queues_arrivals: bool
    queue_order: QueueOrder | None  # which waiting prompt starts next (None: arrival order, fixed)
    kv_limit: KVLimit | None  # the setting's KV-cache limit (`sim.engine.kvlimit` enforces it); None: none

    def schedule(self, state: EngineState) -> list[Work]:
        """The calls of the next iteration, in order; [] when there is nothing to do now."""
