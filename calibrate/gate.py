"""The correctness gate run before any timing: chunking must not change what the model computes."""
from __future__ import annotations

import numpy as np

from calibrate.kernels import new_cache, prefill_chunk
from calibrate.model import LoadedModel

RTOL = ATOL = 1e-3


def chunked_logits_match(lm: LoadedModel, prompt: list[int], budget: int) -> dict:
    """Last-position logits of a chunked prefill against a one-shot prefill (FP32, rtol=atol=1e-3)."""
    _, one_shot = prefill_chunk(lm, new_cache(lm), prompt)
    cache = new_cache(lm)
    for i in range(0, len(prompt), budget):
        token, chunked = prefill_chunk(lm, cache, prompt[i:i + budget])
    a, b = np.array(one_shot), np.array(chunked)
    return {"budget": budget, "prompt_len": len(prompt), "max_abs_diff": float(np.abs(a - b).max()),
            "ok": bool(np.allclose(b, a, rtol=RTOL, atol=ATOL)), "same_token": int(a.argmax()) == token}
