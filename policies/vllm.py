"""vllm: the decisions of vLLM v1's scheduler (vLLM, and vllm-metal on Apple silicon).

Read from `vllm/v1/core/sched/scheduler.py` of vLLM 0.27.1 (the version vllm-metal pins;
`Scheduler.schedule`, lines cited below), synchronous scheduling, FCFS, no prefix caching,
chunked prefill on. Each step is ONE forward (`sim.engine.work.Mixed`) over every row scheduled:

1. the running requests, in the order they were admitted (L484-485), each for the fewest of its
   remaining tokens (the rest of its prompt, or 1 to decode), `long_prefill_token_threshold`
   when it is above 0 and below them (L521-522), and what is left of the token budget
   `max_num_batched_tokens` (L523); a request given 0 tokens is passed over, not a stop (L557-573);
2. then the waiting requests, in queue order (FCFS; a preempted request goes back to the front,
   L1314), while the budget is not spent and fewer than `max_num_seqs` run (L687-692), each for
   the fewest of its prompt, the threshold and the budget (L879-913); the first that does not fit
   the KV cache stops admission (L987-994);
3. the forward that completes a prompt samples its first token; every other row a decode's.

The KV cache is pdsim's `--kv-limit` (tokens; vLLM counts 16-token blocks), and preemption is
pdsim's recompute of the newest request (`sim.engine.kvlimit`): vLLM preempts the last admitted,
which differs only for a request admitted again after a preemption. `max_num_partial_prefills`
is not a v1 option (0.27.1 has no such field). The defaults are `vllm serve`'s on a GPU with less
than 70 GiB (a Mac with 64 GB or less: `engine/arg_utils.py` L2515-2596): a budget of 2048 tokens
and 256 sequences; vLLM refuses a budget below `max_num_seqs` (`config/scheduler.py` L249-285).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from policies.base import PolicyError
from policies.queue import QueueOrder
from sim.engine.memory import KVLimit, parse_kv_limit
from sim.engine.state import EngineState
from sim.engine.work import Mixed, Work

MODELLED = ("0.27.1",)  # vLLM versions whose scheduler this policy was read from
SERVER_FLAGS = {"max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
                "long_prefill_token_threshold": "--long-prefill-token-threshold"}
DEFAULTS = {"max_num_batched_tokens": 2048, "max_num_seqs": 256, "long_prefill_token_threshold": 0}


@dataclass
class Vllm:
    max_num_batched_tokens: int = DEFAULTS["max_num_batched_tokens"]
    max_num_seqs: int = DEFAULTS["max_num_seqs"]
    long_prefill_token_threshold: int = DEFAULTS["long_prefill_token_threshold"]
    kv_limit: KVLimit | None = None
    name: str = "vllm"
    engine: ClassVar[str] = "pdsim"  # its forwards run on pdsim's executor (`calibrate.engine.mixed`)
    # an iteration of decodes only repeats until a request arrives or finishes; one with a
    # prompt's rows changes with the budget left, so it runs alone (`sim.steady`)
    steady: ClassVar[bool] = True
    queues_arrivals: ClassVar[bool] = False  # its stretches need an empty queue (`sim.steady`)
    steady_chunks: ClassVar[bool] = False
    queue_order: ClassVar[QueueOrder | None] = None  # FCFS: the state's queue order
    _running: list[str] = field(default_factory=list, repr=False)  # admitted requests, in admission order
    _state: object = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for key in DEFAULTS:
            v = getattr(self, key)
            low = 0 if key == "long_prefill_token_threshold" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise PolicyError(f"vllm: {key} must be a whole number >= {low}, got {v!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise PolicyError(f"vllm: max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than or "
                              f"equal to max_num_seqs ({self.max_num_seqs}), as vLLM requires")
        self.kv_limit = parse_kv_limit(self.kv_limit)

    def schedule(self, state: EngineState) -> list[Work]:
        if self._state is not state:  # a new run
            self._state, self._running = state, []
        # running: admitted and still holding work (a preempted request is waiting again, L1314)
        self._running = [r for r in self._running if r in state.ready or (r in state.queued
                                                                         and state.queued[r].prefilled)]
        budget, rows, growing = self.max_num_batched_tokens, [], 0
        for rid in self._running:  # L484-638
            if budget <= 0:
                break
            n = 1 if rid in state.ready else self._tokens(state.queued[rid].prefill_left, budget)
            rows.append((rid, n))
            budget -= n
            growing += n if rid in state.queued else 0  # (decode rows: `len(state.ready)` below)
        running, reserved = set(self._running), growing  # the cache the running rows take this forward
        preempted = state.preempted_in == state.iteration + 1  # this step: no admission (L684)
        for rid, s in state.queued.items():  # L687-1097: waiting, in queue order
            if preempted or budget <= 0 or len(self._running) >= self.max_num_seqs:
                break
            if rid in running:
                continue
            need = state.kv_need(s)  # its whole cache, as vLLM reserves the whole prompt's blocks (L973-985)
            if state.kv_limit is not None and state.kv_used + len(state.ready) + reserved + need > state.kv_limit:
                break  # the KV cache cannot hold it: admission stops (L987-994)
            n = self._tokens(s.prefill_left, budget)
            rows.append((rid, n))
            self._running.append(rid)
            reserved += need
            budget -= n
        return [Mixed(tuple(rows))] if rows else []

    def _tokens(self, left: int, budget: int) -> int:
        thr = self.long_prefill_token_threshold
        return min(thr if 0 < thr < left else left, budget)


def server_flags(setting: dict) -> str:
    """The `vllm serve` flags that run this setting."""
    return " ".join(f"{SERVER_FLAGS[k]} {setting.get(k, DEFAULTS[k])}" for k in SERVER_FLAGS)
