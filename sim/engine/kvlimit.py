"""The KV-cache limit: the next iteration's work, after the preemptions the limit forces.

Both executors ask `next_work` instead of the policy itself, so the same preemptions happen in the
simulator and on the real engine. vLLM's default (preemption by recompute): a policy admits a
request to prefill only when `EngineState.fits` says its whole cache fits; the iteration the
policy then asks for is given room before it runs (`EngineState.kv_after`, no cache freed inside
it counted); when it does not fit, the newest request holding a cache is preempted
(`EngineState.victim`, `EngineState.preempt`: its cache freed, back to the queue, recomputed
later) and the policy is asked again, until the iteration fits. The oldest request is never
preempted while another holds a cache, and alone every request fits (`sim.engine.state.check_kv_fit`),
so every run ends.
"""
from __future__ import annotations

from typing import Callable

from policies.base import Policy
from sim.core.errors import InputError
from sim.engine.memory import device_kv_tokens, parse_kv_limit, profile_kv_bytes
from sim.engine.state import EngineError, EngineState, check_kv_fit
from traces.trace import Trace
from sim.engine.work import Prefill, Work


def next_work(policy: Policy, state: EngineState, at: float,
              on_preempt: Callable[[str], None] | None = None) -> list[Work]:
    """The policy's next work once it fits the state's KV limit; preemptions logged at time `at`
    (the executor frees the preempted request's cache in `on_preempt`)."""
    work = policy.schedule(state)
    limit = state.kv_limit
    if limit is None:
        return work
    while True:
        for w in work:  # an admission the policy made without asking `fits` is its bug
            if isinstance(w, Prefill) and w.rid in state.queued and not state.queued[w.rid].prefilled \
                    and not state.fits(w.rid):
                raise EngineError(f"policy {policy.name!r} admitted {w.rid!r} to prefill without room in the "
                                  f"KV cache ({state.kv_used} of {limit} tokens held; it needs "
                                  f"{state.kv_need(state.queued[w.rid])})")
        if state.kv_after(work) <= limit:
            return work
        victim = state.victim()
        if victim is None:
            raise EngineError(f"policy {policy.name!r}: an iteration needs {state.kv_after(work)} tokens of KV "
                              f"cache with none held; the limit is {limit}")
        state.preempt(victim, at, state.iteration + 1)
        if on_preempt is not None:
            on_preempt(victim)
        work = policy.schedule(state)


def kv_limit_of(policy: Policy, bytes_per_token: int | None, capacity: int | None = None) -> int | None:
    """The KV limit a run enforces, in tokens: the setting's (`sim.engine.memory.KVLimit`) or the device's
    `capacity` (`sim.engine.memory.device_kv_tokens`), whichever is smaller; None: no limit. A device holds
    no more than it holds whatever the setting says, so its capacity is the default. mlx-lm's
    BatchGenerator has no limit, and its policy gets none: it runs as it is."""
    limit = getattr(getattr(policy, "opts", None), "kv_limit", None)
    return enforced(None if limit is None else limit.resolve(bytes_per_token), capacity,
                    getattr(policy, "engine", "pdsim"))


def enforced(tokens: int | None, capacity: int | None, engine: str) -> int | None:
    """The limit a run on `engine` enforces: the setting's `tokens` within the device's `capacity`."""
    if capacity is None or engine == "mlx-lm":
        return tokens
    return capacity if tokens is None else min(tokens, capacity)


def check_kv_limits(prof: dict, traces: dict[str, Trace], settings: list[dict]) -> None:
    """Refuse, before any run, a KV limit the profile cannot turn into tokens (an amount of memory
    with no model shapes) and a trace with a request that could never fit a setting's limit, or
    the device's (`sim.engine.memory.device_kv_tokens`)."""
    capacity = device_kv_tokens(prof)
    for s in settings:
        limit = parse_kv_limit(s.get("kv_limit"))
        asked = None if limit is None else limit.resolve(profile_kv_bytes(prof))
        tokens = enforced(asked, capacity, "mlx-lm" if s.get("policy") == "mlx-lm" else "pdsim")
        if tokens is None:
            continue
        if tokens != asked:
            limit = f"(none: the device's {capacity:,} tokens beside the weights)"
        for name, trace in traces.items():
            try:
                check_kv_fit(trace, tokens)
            except InputError as e:
                raise InputError(f"trace {trace.meta.get('source', name)}, --kv-limit {limit} "
                                 f"({tokens:,} tokens of {prof['model']['name']}): {e}") from None
