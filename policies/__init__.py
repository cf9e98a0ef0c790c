"""Scheduling policies, by name. `make(name, **options)` builds one; `POLICIES` lists them."""
from __future__ import annotations

from typing import Callable, NamedTuple

from policies.base import Options, Policy, PolicyError
from policies.chunked import Chunked, eager
from policies.fifo import Fifo


class PolicyInfo(NamedTuple):
    """A policy's one-line description, its factory, and the options its loop reads: the others
    do not change what it runs (`sim.settings` gives them one fixed value, so fifo at batch size 4
    and at 8 is one setting, swept once)."""
    doc: str
    build: Callable[[Options], Policy]
    uses: tuple[str, ...]


POLICIES = {
    "fifo": PolicyInfo("one request at a time: its whole prefill, then all its decodes (the meTile FIFO reference)",
                       lambda o: Fifo(o), ("decode",)),
    "eager": PolicyInfo("a request's whole prompt in one prefill call, then one decode for every active request",
                        eager, ("batch_size", "decode", "order")),
    "chunked": PolicyInfo("the pending request prefills at most `budget` tokens per iteration, then one decode "
                          "for every active request", lambda o: Chunked(o), ("budget", "batch_size", "decode", "order")),
}

OPTION_HELP = {
    "budget": "prompt tokens per iteration (chunked; fifo and eager prefill whole prompts)",
    "batch_size": "maximum requests decoding at once (eager, chunked; fifo decodes one request at a time)",
    "decode": "batched (one call for all) | single (one call per request)",
    "order": "chunk-first (tiny-llm) | decode-first (meTile) (eager, chunked)",
}


def make(policy: str, budget: int | None = None, batch_size: int = 4, decode: str = "batched",
         order: str = "chunk-first") -> Policy:
    """Build a policy from a setting dict's fields (policy name, budget, batch size, decode, order)."""
    if policy not in POLICIES:
        raise PolicyError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    if policy == "chunked" and budget is None:
        raise PolicyError("policy 'chunked' needs a budget (--budget N)")
    return POLICIES[policy].build(Options(budget, batch_size, decode, order))


__all__ = ["OPTION_HELP", "POLICIES", "Options", "Policy", "PolicyError", "PolicyInfo", "make"]
