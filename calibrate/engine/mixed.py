"""vLLM's one forward per iteration on MLX: prompt chunks and decodes of several requests in one
pass over the same mlx-lm Qwen3 modules and weights (`sim.engine.work.Mixed`).

The embeddings, every projection and the MLP run over all rows' tokens at once, as one
(1, T) sequence: the weights are read once for the whole iteration, which is what fusing buys.
Attention runs row by row, each request's queries at its own cache offset (RoPE) against its own
KV cache (mlx-lm's `KVCache`, the same per-request caches pdsim's chunked engine uses), causal
within a chunk: a decode row is a one-token chunk. Batching the decode rows' attention as well
would need their caches padded into one batch cache, which costs copies every time a request
joins or leaves; per-row attention needs none. Only each row's last position goes through the
LM head.
"""
from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.base import scaled_dot_product_attention

from calibrate.engine.kernels import Cache, _head
from calibrate.engine.model import LoadedModel, ModelError, is_hybrid


def mixed_forward(lm: LoadedModel, caches: list[Cache], rows: list[list[int]]) -> list[tuple[int, mx.array]]:
    """One forward over `rows` (each a list of token ids), row i on `caches[i]` at its offset;
    each row's greedy next token and its last position's float32 logits."""
    if not rows or any(not r for r in rows):
        raise ValueError("mixed_forward needs rows of at least one token each")
    if is_hybrid(lm.config):
        raise ModelError(f"{lm.name}: vLLM's fused forward runs dense Qwen3 models only; a hybrid model runs "
                         "the chunked, eager and fifo policies and mlx-lm")
    m = lm.model.model
    bounds, start = [], 0
    for r in rows:
        bounds.append((start, start + len(r)))
        start += len(r)
    h = m.embed_tokens(mx.array([[t for r in rows for t in r]], dtype=mx.int32))  # (1, T, D)
    for li, layer in enumerate(m.layers):
        att, x = layer.self_attn, layer.input_layernorm(h)
        q_all, k_all, v_all = att.q_proj(x), att.k_proj(x), att.v_proj(x)
        outs = []
        for (s, e), cache in zip(bounds, caches):
            c, n = cache[li], e - s
            q = att.q_norm(q_all[:, s:e].reshape(1, n, att.n_heads, -1)).transpose(0, 2, 1, 3)
            k = att.k_norm(k_all[:, s:e].reshape(1, n, att.n_kv_heads, -1)).transpose(0, 2, 1, 3)
            v = v_all[:, s:e].reshape(1, n, att.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q, k = att.rope(q, offset=c.offset), att.rope(k, offset=c.offset)
            k, v = c.update_and_fetch(k, v)
            o = scaled_dot_product_attention(q, k, v, cache=c, scale=att.scale, mask="causal" if n > 1 else None)
            outs.append(o.transpose(0, 2, 1, 3).reshape(1, n, -1))
        h = h + att.o_proj(mx.concatenate(outs, axis=1) if len(outs) > 1 else outs[0])
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    h = m.norm(h)
    logits = _head(lm, h[0, mx.array([e - 1 for _, e in bounds])])  # (rows, V)
    tokens = mx.argmax(logits, axis=-1)
    mx.eval(tokens, logits, [c.state for cache in caches for c in cache])
    return [(int(t), logits[i]) for i, t in enumerate(tokens.tolist())]
