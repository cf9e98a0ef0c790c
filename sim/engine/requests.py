"""A request as the engine holds it: how far its prefill and its outputs have come, and what it
still owes. Both executors advance it through `sim.engine.state.EngineState` only."""
from __future__ import annotations

from dataclasses import dataclass

from traces.trace import Request


class Freed:
    """The batch cache's row of a preempted request, until the next sync drops it (a leave): its
    cache is freed at once, its row is gone from the batch at the batch's next rebuild."""
    __slots__ = ("rid",)

    def __init__(self, rid: str):
        self.rid = rid

    def __repr__(self) -> str:
        return f"Freed({self.rid!r})"

    def __eq__(self, other) -> bool:  # a batch holds at most one freed row per request (a sync drops it)
        return isinstance(other, Freed) and other.rid == self.rid

    def __hash__(self) -> int:
        return hash(("freed", self.rid))


@dataclass(slots=True)
class RequestState:
    req: Request
    prefilled: int = 0  # prompt tokens in the cache
    generated: int = 0  # tokens emitted (the first comes from the last prefill chunk)
    # mlx-lm's one-step pipeline (`FirstForward`, `Generate`): the step that returns token j also
    # writes it to the cache and samples token j + 1, so the next step attends one token more
    pipelined: bool = False
    preempted: bool = False  # its cache was freed once (`EngineState.preempt`): it resumes before new prompts

    @property
    def rid(self) -> str:
        return self.req.id

    @property
    def target(self) -> int:
        """Tokens its prefill puts in the cache: the prompt; after a preemption (vLLM's recompute)
        the prompt and every output but the last, which the next decode reads as its input."""
        return self.req.prompt_len + (self.generated - 1 if self.generated else 0)

    @property
    def prefill_left(self) -> int:
        return self.target - self.prefilled

    @property
    def owes_decode(self) -> bool:
        """Whether it still decodes once its prefill ends (a first prefill emits a token, a
        recompute none)."""
        return self.req.output_len - self.generated > (0 if self.generated else 1)

    @property
    def output_left(self) -> int:
        return self.req.output_len - self.generated

    @property
    def context(self) -> int:
        """Tokens the next decode step attends to: the prompt, the outputs so far (and, pipelined,
        the one the step writes before returning it)."""
        return self.req.prompt_len + self.generated + self.pipelined
