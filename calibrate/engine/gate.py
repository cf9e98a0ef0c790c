"""The correctness gate run before any timing: chunking must not change what the model computes."""
from __future__ import annotations

import mlx.core as mx
import numpy as np

from calibrate.engine.kernels import _head, _hidden, new_cache, prefill_chunk
from calibrate.engine.mixed import mixed_forward
from calibrate.engine.model import LoadedModel

RTOL = ATOL = 1e-3  # float32 arithmetic
TF32_TOL = 1e-2  # float32 products on TF32 tensor cores (MLX on a CUDA GPU): a 10-bit mantissa
TF32_ERROR = 1e-5  # a float32 product lands ~1e-7 from float64; a TF32 one ~3e-4


def matmul_rel_error(n: int = 256) -> float:
    """How far this device's float32 matrix product lands from float64's, relative: what tells
    true float32 arithmetic from TF32, which an H200 runs for float32 (1.6e-3 logit differences
    between a chunked and a one-shot prefill of the same prompt, where a CPU shows 1e-5)."""
    a, b = np.random.default_rng(0).standard_normal((2, n, n)).astype(np.float32)
    out = np.array(mx.array(a) @ mx.array(b)).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


EPSILON = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}  # each dtype's machine epsilon
ULPS = 4  # a 16-bit dtype's logits may differ by this many of its epsilons (rounding over layers), unmeasured on a GPU


def tolerance(dtype: str = "float32") -> float:
    """The gate's rtol and atol for logits computed in `dtype` on this device: FP32's, TF32's where
    the products run in TF32, or a 16-bit dtype's own rounding (`ULPS` epsilons: bfloat16 0.031,
    float16 0.0039). On this CPU chunked and one-shot logits were bit-identical (chunks of 8 and
    32): qwen3-tiny in all three dtypes, qwen3-0.6b in float32, each 4-bit or not."""
    fp32 = TF32_TOL if matmul_rel_error() > TF32_ERROR else RTOL
    return max(fp32, ULPS * EPSILON[dtype])


def chunked_logits_match(lm: LoadedModel, prompt: list[int], budget: int, tol: float = RTOL) -> dict:
    """Last-position logits of a chunked prefill against a one-shot prefill (rtol=atol=`tol`)."""
    _, one_shot = prefill_chunk(lm, new_cache(lm), prompt)
    cache = new_cache(lm)
    for i in range(0, len(prompt), budget):
        token, chunked = prefill_chunk(lm, cache, prompt[i:i + budget])
    a, b = np.array(one_shot), np.array(chunked)
    return {"budget": budget, "prompt_len": len(prompt), "max_abs_diff": float(np.abs(a - b).max()),
            "tolerance": tol, "ok": bool(np.allclose(b, a, rtol=tol, atol=tol)), "same_token": int(a.argmax()) == token}


def mixed_logits_match(lm: LoadedModel, tol: float = RTOL, seed: int = 0) -> dict:
    """vLLM's one forward (`calibrate.engine.mixed`) against the same rows run apart: a decode
    row of a request 20 tokens in, a whole 13-token prompt, and the second chunk of a prompt
    whose first 9 tokens are cached; each row's last-position logits within `tol`."""
    rng = np.random.default_rng(seed)
    a, b, c = (rng.integers(0, lm.vocab_size, n).tolist() for n in (20, 13, 16))

    def caches():
        ca, cb, cc = new_cache(lm), new_cache(lm), new_cache(lm)
        token, _ = prefill_chunk(lm, ca, a)
        prefill_chunk(lm, cc, c[:9])
        return ca, cb, cc, token
    ca, cb, cc, token = caches()
    mixed = [np.array(logits) for _, logits in mixed_forward(lm, [ca, cb, cc], [[token], b, c[9:]])]
    ca, cb, cc, token = caches()
    apart = [np.array(_head(lm, _hidden(lm, mx.array([[token]], dtype=mx.int32), ca)[0, -1])),
             np.array(prefill_chunk(lm, cb, b)[1]), np.array(prefill_chunk(lm, cc, c[9:])[1])]
    diff = max(float(np.abs(x - y).max()) for x, y in zip(mixed, apart))
    return {"rows": 3, "max_abs_diff": diff, "tolerance": tol,
            "ok": all(np.allclose(x, y, rtol=tol, atol=tol) for x, y in zip(mixed, apart))}
