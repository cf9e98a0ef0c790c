"""Scheduling policies, by name. `make(name, **options)` builds one; `POLICIES` lists them."""
from __future__ import annotations

from policies.base import Options, Policy, PolicyError
from policies.chunked import Chunked, eager
from policies.fifo import Fifo

POLICIES = {
    "fifo": ("one request at a time: its whole prefill, then all its decodes (the meTile FIFO reference)",
             lambda o: Fifo(o)),
    "eager": ("a request's whole prompt in one prefill call, then one decode for every active request",
              eager),
    "chunked": ("the pending request prefills at most `budget` tokens per iteration, then one decode "
                "for every active request", lambda o: Chunked(o)),
}

OPTION_HELP = {
    "budget": "prompt tokens per iteration (chunked; fifo and eager prefill whole prompts)",
    "batch_size": "maximum requests decoding at once",
    "decode": "batched (one call for all) | single (one call per request)",
    "order": "chunk-first (tiny-llm) | decode-first (meTile)",
}


def make(policy: str, budget: int | None = None, batch_size: int = 4, decode: str = "batched",
         order: str = "chunk-first") -> Policy:
    """Build a policy from a setting dict's fields (policy name, budget, batch size, decode, order)."""
    if policy not in POLICIES:
        raise PolicyError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    if policy == "chunked" and budget is None:
        raise PolicyError("policy 'chunked' needs a budget (--budget N)")
    return POLICIES[policy][1](Options(budget, batch_size, decode, order))


__all__ = ["POLICIES", "Options", "Policy", "PolicyError", "make"]
