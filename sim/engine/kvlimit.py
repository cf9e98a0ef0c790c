"""The KV-cache limit: the next iteration's work, after the preemptions the limit forces.

Both executors ask `next_work` instead of the policy itself, so the same preemptions happen in the
simulator and on the real engine. vLLM's default (preemption by recompute): a policy admits a
request to prefill only when `fits` says its whole cache fits; the iteration the
policy then asks for is given room before it runs (`kv_after`, no cache freed inside
it counted); when it does not fit, the newest request holding a cache is preempted
(`victim`, `preempt`: its cache freed, back to the queue, recomputed
later) and the policy is asked again, until the iteration fits. The oldest request is never
preempted while another holds a cache, and alone every request fits (`check_kv_fit`),
so every run ends.

`KVLimitRules` is the part of `sim.engine.state.EngineState` that knows the limit: what a request's
admission needs, what an iteration adds, whom a preemption frees, and the preemption itself.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Protocol

from sim.core.errors import InputError
from sim.engine.log import Call
from sim.engine.memory import KVLimit, device_kv_tokens, parse_kv_limit, profile_kv_bytes, profile_state_tokens
from sim.engine.requests import Freed, RequestState
from sim.engine.work import Decode, EngineError, Mixed, Prefill, Work
from traces.trace import Trace


class KVLimitError(InputError):
    """A request that can never fit the KV-cache limit: the run would never finish."""


class Scheduler(Protocol):
    """What the engine asks of a policy (`policies.base.Policy` has all of it and more)."""
    name: str
    engine: str
    kv_limit: KVLimit | None

    def schedule(self, state) -> list[Work]: ...


class KVLimitRules:
    """The KV-limit half of `EngineState`: `kv_limit` (tokens; None: no limit) and `kv_used`
    (tokens in every cache now, pdsim's engine only) are the state's."""

    def kv_need(self, s: RequestState) -> int:
        """Tokens a request's admission asks for: its whole cache after the prefill and the token
        its first decode writes (`target + 1`), and never more than its cache ever holds
        (prompt + output - 1: the last output token is never written)."""
        return min(s.target + 1, s.req.prompt_len + s.req.output_len - 1)

    def fits(self, rid: str) -> bool:
        """Whether queued request `rid` may start its (re)prefill now: its whole cache fits beside
        the caches held and the token each ready request writes at its next decode. A request
        admitted so fits any one iteration's calls, so admission never forces its own preemption.
        A hybrid model's linear-layer state counts as `state_tokens` more per request holding one."""
        if self.kv_limit is None:
            return True
        s = self.queued[rid]
        if s.prefilled:  # admitted already
            return True
        return self.kv_held() + self.state_tokens + len(self.ready) + self.kv_need(s) <= self.kv_limit

    def kv_held(self) -> int:
        """Tokens the caches hold now, with every held linear-layer state (`state_tokens` each)."""
        if not self.state_tokens:
            return self.kv_used
        holders = len(self.ready) + sum(1 for q in self.queued.values() if q.prefilled)
        return self.kv_used + self.state_tokens * holders

    def kv_after(self, work: list[Work]) -> int:
        """Tokens the caches hold once `work` has run, counting no cache freed within it: an
        iteration's tokens are all given room before it runs (as vLLM's scheduler does)."""
        n = self.kv_held()
        for w in work:
            if isinstance(w, Prefill):
                n += w.tokens
                if self.state_tokens and not self.queued[w.rid].prefilled:  # its state, from its first chunk
                    n += self.state_tokens
            elif isinstance(w, Decode):
                n += len(w.rids)
            elif isinstance(w, Mixed):
                n += sum(k for _, k in w.rows)
        return n

    def victim(self) -> str | None:
        """The request a preemption frees: the newest (latest arrival, then latest in the trace)
        among those holding a cache (decoding, or with a prefill begun); None if none holds one."""
        held = [r for r, s in self.queued.items() if s.prefilled] + list(self.ready)
        if self._position is None:
            self._position = {r.id: i for i, r in enumerate(self.trace.requests)}
        return max(held, key=self._position.__getitem__) if held else None

    def preempt(self, rid: str, at: float, iteration: int) -> int:
        """Free `rid`'s cache (vLLM's preemption by recompute); return the tokens freed.

        Its tokens emitted stay emitted; it goes back to the queue, ahead of every request that
        has not begun its prefill and behind those that have, and its next prefill recomputes the
        prompt and the outputs but the last (`RequestState.target`), emitting nothing. Logged as
        a call of kind "preempt" (`tokens`: the tokens freed, which will be prefilled again)."""
        self._followed = None
        if at < self.now:
            raise EngineError(f"time went backwards: preemption at {at} after {self.now}")
        if rid in self.ready:
            s = self.ready.pop(rid)
            if s.pipelined:
                raise EngineError(f"preemption of {rid!r}: mlx-lm's generation batch has no preemption")
            freed = s.req.prompt_len + s.generated - 1
        elif rid in self.queued and self.queued[rid].prefilled:
            s = self.queued.pop(rid)
            freed = s.prefilled
        else:
            raise EngineError(f"preemption of {rid!r}: it holds no cache")
        s.prefilled, s.preempted = 0, True
        self.kv_used -= freed
        self.kv.preempt(rid, Freed(rid))
        begun = [(r, q) for r, q in self.queued.items() if q.prefilled]
        if begun:
            rest = [(r, q) for r, q in self.queued.items() if not q.prefilled]
            self.queued = OrderedDict(begun + [(rid, s)] + rest)
        else:
            self.queued[rid] = s
            self.queued.move_to_end(rid, last=False)
        self.now = at
        self.preempted_in = iteration
        self.log.add(Call("preempt", at, at, (rid,), freed, 0, (), 0, 0, iteration))
        return freed


def check_kv_fit(trace: Trace, kv_limit: int, state: int = 0) -> None:
    """Refuse a trace with a request whose cache alone outgrows the limit (prompt + output - 1
    tokens at its last decode, and `state` tokens for a hybrid model's linear-layer state): it
    could never finish, and the run would never end."""
    if kv_limit < 1:
        raise KVLimitError(f"kv limit must be at least 1 token, got {kv_limit}")
    for r in trace.requests:
        if r.prompt_len + r.output_len - 1 + state > kv_limit:
            held = f" + {state:,} for its linear layers' state" if state else ""
            raise KVLimitError(f"request {r.id} needs {r.prompt_len + r.output_len - 1 + state:,} tokens of KV cache "
                               f"({r.prompt_len:,} prompt + {r.output_len:,} output - 1{held}) and the kv limit is "
                               f"{kv_limit:,} tokens: it could never finish (raise --kv-limit or cut the trace "
                               "with --max-prompt / --max-output)")


def next_work(policy: Scheduler, state: KVLimitRules, at: float,
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


def kv_limit_of(policy: Scheduler, bytes_per_token: int | None, capacity: int | None = None) -> int | None:
    """The KV limit a run enforces, in tokens: the setting's (`sim.engine.memory.KVLimit`) or the device's
    `capacity` (`sim.engine.memory.device_kv_tokens`), whichever is smaller; None: no limit. A device holds
    no more than it holds whatever the setting says, so its capacity is the default. mlx-lm's
    BatchGenerator has no limit, and its policy gets none: it runs as it is."""
    limit = policy.kv_limit
    return enforced(None if limit is None else limit.resolve(bytes_per_token), capacity, policy.engine)


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
                check_kv_fit(trace, tokens, profile_state_tokens(prof))
            except InputError as e:
                raise InputError(f"trace {trace.meta.get('source', name)}, --kv-limit {limit} "
                                 f"({tokens:,} tokens of {prof['model']['name']}): {e}") from None
