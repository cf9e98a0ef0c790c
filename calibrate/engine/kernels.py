"""The engine's step functions on real MLX: the only code that runs the model.

The real executor and the profiler call these same functions, so what the profiler times is what
the engine runs. Every function evaluates its results and the caches it touched (`mx.eval`) before
returning: MLX is lazy, and a caller timing with `time.perf_counter()` around a call must see the
work done inside it, not deferred into the next call. No device is named anywhere: MLX's default
device is used (the CPU on Linux, the GPU on a Mac).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from calibrate.engine.model import LoadedModel

Cache = list[Any]  # one mlx-lm cache per layer


def new_cache(lm: LoadedModel) -> Cache:
    """A fresh per-request cache: one `KVCache` per attention layer, one `ArraysCache` (its
    conv and recurrent state) per linear-attention layer of a hybrid model."""
    return make_prompt_cache(lm.model)


def _merge(caches: list) -> Any:
    """One layer's per-request caches as one batch cache: left-padded KV rows (`BatchKVCache`), or a
    linear layer's states stacked (`ArraysCache.merge`)."""
    return type(caches[0]).merge(caches)


def is_kv(layer) -> bool:
    """Whether a layer's cache is an attention layer's KV cache (else a linear layer's `ArraysCache`)."""
    return not isinstance(layer, ArraysCache)


def first_kv(cache: Cache):
    """The cache's first attention layer: what its length and buffer sizes are read from (a linear
    layer's state has neither)."""
    return next(c for c in cache if is_kv(c))


def offset(cache: Cache) -> int:
    """Tokens the cache holds."""
    return first_kv(cache).offset


def materialize(cache: Cache) -> None:
    """Evaluate every layer's keys and values, so the next step starts from concrete state."""
    mx.eval([c.state for c in cache])


def causal_mask(chunk_len: int, prefix_len: int) -> np.ndarray:
    """The L x S additive mask (0 / -inf) of a chunk of L tokens after `prefix_len` cached ones.

    Built by mlx-lm's own `create_causal_mask` (what `KVCache.make_mask` returns as an array):
    query i sits at absolute position prefix_len + i and sees keys 0..prefix_len + i. For the
    per-request cache mlx-lm passes the string "causal" instead, which MLX's attention aligns
    lower-right, i.e. the same mask (checked by the tests).
    """
    allowed = np.array(create_causal_mask(chunk_len, offset=prefix_len))
    return np.where(allowed, 0.0, -np.inf).astype(np.float32)


def _hidden(lm: LoadedModel, tokens: mx.array, cache: Cache) -> mx.array:
    """Final-norm hidden states (B, L, D); the LM head is applied separately, to what is needed."""
    return lm.model.model(tokens, cache=cache)


def _head(lm: LoadedModel, h: mx.array) -> mx.array:
    """Logits in float32 for hidden states `h` (tied embedding or separate lm_head)."""
    if lm.config["tie_word_embeddings"]:
        logits = lm.model.model.embed_tokens.as_linear(h)
    else:
        logits = lm.model.lm_head(h)
    return logits.astype(mx.float32)


def prefill_chunk(
    lm: LoadedModel,
    cache: Cache,
    token_ids: list[int],
    return_all_logits: bool = False,
) -> tuple[int, mx.array]:
    """Run one prompt chunk at the cache's current offset; return (greedy token, logits).

    The token and the (V,) float32 logits come from the chunk's last position; only that position
    goes through the LM head, as in a serving engine, so a chunk's cost is not inflated by L x V
    logits nobody reads. `return_all_logits` returns (L, V) logits instead (for tests).
    mlx-lm applies RoPE from `cache.offset` and a lower-right causal mask over the cached prefix.
    """
    if not token_ids:
        raise ValueError("prefill_chunk needs at least one token")
    h = _hidden(lm, mx.array([token_ids], dtype=mx.int32), cache)
    logits = _head(lm, h[0] if return_all_logits else h[0, -1])
    token = mx.argmax(logits[-1] if return_all_logits else logits)
    mx.eval(token, logits, [c.state for c in cache])
    return int(token.item()), logits


def decode_one(lm: LoadedModel, cache: Cache, last_token: int) -> int:
    """One decode step of a request alone on its own per-request cache; the greedy next token."""
    h = _hidden(lm, mx.array([[last_token]], dtype=mx.int32), cache)
    token = mx.argmax(_head(lm, h[0, -1]))
    mx.eval(token, [c.state for c in cache])
    return int(token.item())


class DecodeBatch:
    """The requests decoding together, over one left-padded `BatchKVCache` per attention layer
    (and, in a hybrid model, the rows' stacked states per linear layer).

    Row i of the batch holds request `ids[i]`. Rows are left-padded to a common length;
    `left_padding` masks the padding and each row's `offset` is its own position, so RoPE and
    attention see exactly what a request alone would see.

    While a request is in the batch its tokens are appended to the batch cache only; its
    per-request cache is stale until it leaves (see `sync`).
    """

    def __init__(self, lm: LoadedModel, ids: list[str] | None = None, cache: Cache | None = None):
        """An empty batch, or one holding `ids` over a batch `cache` built elsewhere (the profiler)."""
        self.lm = lm
        self.ids: list[str] = list(ids or [])
        self.cache: Cache | None = cache  # None when the batch is empty

    def __len__(self) -> int:
        return len(self.ids)

    def sync(self, ids: list[str], caches: dict[str, Cache]) -> tuple[int, int]:
        """Make the batch's rows equal `ids`, in that order; return (joined, left) counts.

        Joining requests are merged in from `caches[id]` (their prefilled per-request caches).
        A leaving request whose id is still a key of `caches` has its grown cache written back
        there (so it may decode alone or rejoin later); drop a finished request's entry from
        `caches` before calling to skip that copy. Unchanged membership does nothing.
        """
        if list(ids) == self.ids:
            return 0, 0
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate request ids in {ids}")
        wanted, present = set(ids), set(self.ids)
        keep = [i for i, rid in enumerate(self.ids) if rid in wanted]
        leaving = [(i, rid) for i, rid in enumerate(self.ids) if rid not in wanted]
        joining = [rid for rid in ids if rid not in present]
        missing = [rid for rid in joining if rid not in caches]
        if missing:
            raise KeyError(f"no per-request cache for joining requests {missing}")

        written_back = []
        for i, rid in leaving:
            if rid in caches:
                caches[rid] = [c.extract(i) for c in self.cache]
                written_back.append(caches[rid])
        if not keep:
            self.cache = None
        elif leaving:
            for c in self.cache:
                c.filter(mx.array(keep))
        rows = [self.ids[i] for i in keep]

        if joining:
            merged = [_merge([caches[rid][layer] for rid in joining]) for layer in range(self.lm.num_layers)]
            if self.cache is None:
                self.cache = merged
            else:
                for c, m in zip(self.cache, merged):
                    c.extend(m)
            rows += joining

        if rows != list(ids):  # same members, other order: permute the rows
            order = mx.array([rows.index(rid) for rid in ids])
            for c in self.cache:
                c.filter(order)
        self.ids = list(ids)
        mx.eval([c.state for c in self.cache or []], [c.state for cc in written_back for c in cc])
        return len(joining), len(leaving)

    def step(self, last_tokens: list[int]) -> list[int]:
        """One batched decode step (input shape (B, 1)); the greedy next token of every row."""
        if len(last_tokens) != len(self.ids):
            raise ValueError(f"{len(last_tokens)} tokens for a batch of {len(self.ids)}")
        if not self.ids:
            return []
        h = _hidden(self.lm, mx.array(last_tokens, dtype=mx.int32)[:, None], self.cache)
        tokens = mx.argmax(_head(self.lm, h[:, -1]), axis=-1)
        mx.eval(tokens, [c.state for c in self.cache])
        return tokens.tolist()
