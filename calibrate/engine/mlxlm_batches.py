"""mlx-lm's own prompt and generation batches, run by a policy's calls instead of BatchGenerator's.

pdsim's executor runs the mlx-lm policy's work (`sim.engine.work`: `JoinPrompt`, `FirstForward`,
`BatchPrefill`, `Generate`) on the installed mlx-lm's `PromptProcessingBatch` and
`GenerationBatch`, the classes `BatchGenerator.next()` itself drives, so every call runs
BatchGenerator's own code (padding, cache merges, the first forward, sampling); only the
decisions come from the policy. Each call ends by synchronizing the stream, so the executor's
clock sees the call's own work (the generation step's forward is otherwise still running when
`GenerationBatch.next` returns: its one-step pipeline).
"""
from __future__ import annotations

import importlib

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from calibrate.engine.kernels import first_kv
from calibrate.engine.model import LoadedModel

G = importlib.import_module("mlx_lm.generate")  # the module: the package's `generate` is a function


def installed_version() -> str:
    from importlib.metadata import version
    return version("mlx-lm")


class MlxLmBatches:
    """A prompt batch and a generation batch over one model, rows named by request id."""

    def __init__(self, lm: LoadedModel, prefill_step: int = 2048):
        self.model = lm.model
        self.sampler = G.greedy_sampler
        self.prefill_step = prefill_step
        self.prompt = G.PromptProcessingBatch.empty(self.model, self.sampler, prefill_step_size=prefill_step)
        self.gen = G.GenerationBatch.empty(self.model, self.sampler)

    def join(self, rids: list[str], max_tokens: list[int]) -> None:
        """Requests with fresh caches join the end of the prompt batch (as `BatchGenerator._make_batch`
        builds them: greedy, no logits processors, no stop sequences: EOS ignored)."""
        n = len(rids)
        new = G.PromptProcessingBatch(self.model, list(rids), [make_prompt_cache(self.model) for _ in rids],
                                      tokens=[[] for _ in rids], prefill_step_size=self.prefill_step,
                                      samplers=[self.sampler] * n, fallback_sampler=self.sampler,
                                      logits_processors=[() for _ in rids], stop_sequences=[G.StopSequences()] * n,
                                      max_tokens=list(max_tokens))
        self.prompt.extend(new)

    def prefill(self, chunks: list[list[int]]) -> None:
        """One call of the prompt batch: chunks[i] for row i, right-padded to the longest."""
        self.prompt.prompt(chunks)
        mx.synchronize()

    def first_forward(self, rids: list[str], last_tokens: list[int]) -> None:
        """Split `rids` off the prompt batch; their last prompt tokens run in one call (which
        samples their first output); they join the generation batch."""
        where = [self.prompt.uids.index(r) for r in rids]
        self.gen.extend(self.prompt.split(where).generate([[t] for t in last_tokens]))
        mx.synchronize()

    def generate(self) -> list[tuple[str, int]]:
        """One step of the generation batch: (request, token) of every row, in the batch's order."""
        out = []
        for r in self.gen.next():
            r.prompt_cache = None  # a finished row's extracted cache: lazy views nobody reads
            out.append((r.uid, r.token))
        mx.synchronize()
        return out

    def sizes(self) -> dict:
        """Rows, left padding, write position and capacity of both batch caches (for tests: reading the
        left padding evaluates it)."""
        out = {}
        for name, b in (("prompt", self.prompt), ("gen", self.gen)):
            c = first_kv(b.prompt_cache) if b.prompt_cache else None
            out[name] = (list(b.uids), c.left_padding.tolist() if c is not None else [], c._idx if c is not None else 0,
                         c.keys.shape[2] if c is not None and c.keys is not None else 0)
        return out
