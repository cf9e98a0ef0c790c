"""The two kinds of engine call a policy can ask for. Both executors run exactly these.

Named tuples: immutable like frozen dataclasses, and much cheaper to build in a long replay.
"""
from __future__ import annotations

from typing import NamedTuple


class Prefill(NamedTuple):
    """Run the next `tokens` prompt tokens of one request, at its current cache offset."""
    rid: str
    tokens: int


class Decode(NamedTuple):
    """One decode step producing one token for each request in `rids`.

    batched=True runs them as one call on a shared batch cache (requests join and leave it);
    batched=False is a call on the request's own cache (meTile's one-request-at-a-time decode).
    """
    rids: tuple[str, ...]
    batched: bool = True


Work = Prefill | Decode
