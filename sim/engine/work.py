"""The kinds of engine call a policy can ask for. Both executors run exactly these.

`Prefill` and `Decode` are pdsim's own engine: one request's chunk on its own cache, and a decode
of the batch. The other four are mlx-lm's `BatchGenerator` (what `mlx_lm.server` runs), whose
`next()` is, in this order: a `Generate` step of the generation batch, an `JoinPrompt` of waiting
requests into the prompt batch, a `FirstForward` of the prompt-batch rows that have only their
held-back last prompt token left (they move to the generation batch), and one `BatchPrefill` of
every row still in the prompt batch (`policies.mlxlm` makes those decisions). `Mixed` is vLLM's
scheduler's: one forward over every running decode and as many prompt tokens as its budget allows
(`policies.vllm`).

Named tuples: immutable like frozen dataclasses, and much cheaper to build in a long replay.
"""
from __future__ import annotations

from typing import NamedTuple


class EngineError(RuntimeError):
    """A policy asked for work that the engine cannot do (a bug in the policy)."""


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


class JoinPrompt(NamedTuple):
    """Requests leave the waiting queue for the end of mlx-lm's prompt batch, in this order. No
    model call and no log entry: the merged caches are empty, and the copy of the batch cache it
    implies (`extend`) is lazy, paid by the next call that evaluates the prompt batch
    (`sim.engine.batchcache.BatchCache`)."""
    rids: tuple[str, ...]


class BatchPrefill(NamedTuple):
    """One call of mlx-lm's prompt batch: `rows` are (request, chunk tokens) for every request in
    the prompt batch, in its order; chunks are right-padded to the longest, every row writes
    that many positions at the batch cache's shared offset, and the padding is rolled to the
    left afterwards. A chunk never includes a prompt's last token (see `FirstForward`)."""
    rows: tuple[tuple[str, int], ...]


class FirstForward(NamedTuple):
    """mlx-lm's first forward: the prompt-batch rows whose only prompt token left is the last one
    (`BatchGenerator.insert` holds it back) are split off the prompt batch and run that token in
    one (len(rids), 1) call, which samples their first output token; they join the end of the
    generation batch. Nothing is returned to the caller yet (the next `Generate` returns it)."""
    rids: tuple[str, ...]


class Generate(NamedTuple):
    """One step of mlx-lm's generation batch (`GenerationBatch.next`), rows in the batch's order:
    returns to every row the token its previous forward sampled, and runs the forward that
    samples the next (a one-step pipeline). Rows that return their last token leave the batch in
    the same call. `next()` hands the tokens back when it returns, after the iteration's other
    calls: their emission time is the end of the iteration (`sim.engine.state.EngineState.apply`)."""
    rids: tuple[str, ...]


class Mixed(NamedTuple):
    """One forward over prompt chunks and decodes together (vLLM's scheduler, `policies.vllm`):
    `rows` are (request, tokens), a decode being a one-token row of a request whose prompt is
    done. Projections and MLP run over every row's tokens at once, attention per row on the
    request's own cache; each row that completes a prompt, and each decode row, samples a token."""
    rows: tuple[tuple[str, int], ...]


Work = Prefill | Decode | JoinPrompt | BatchPrefill | FirstForward | Generate | Mixed
