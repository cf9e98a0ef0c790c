"""Synthetic traces: the tiny-llm benchmark trace, explicit arrivals, Poisson and gamma processes.

Every generator is deterministic in its seed, and records its parameters in the trace's metadata.
"""
from __future__ import annotations

import math
import random

import numpy as np

from traces.schema import MAX_TOKENS
from traces.trace import Request, Trace, TraceError

QWEN3_VOCAB = 151936
MAX_REQUESTS = 10_000_000  # a generated trace larger than this is a typo, not a workload
MAX_WITH_IDS = 100_000  # tinyllm draws every prompt token id: 100,000 requests of 512 tokens is 51 M ids

# The one statement of the convention; help texts and docs point here.
BURSTINESS_HELP = ("the gamma shape of the inter-arrival gaps, vLLM's convention: 1 = Poisson, below 1 burstier "
                   "(CV^2 of the gaps = 1/burstiness), above 1 more even")


def gamma_gaps(rng: np.random.Generator, n: int, rate: float, burstiness: float) -> np.ndarray:
    """`n` inter-arrival gaps with mean 1/rate, drawn as vLLM's serving benchmark draws them:
    gamma with shape = burstiness and scale = 1/(rate * burstiness). burstiness 1 is Poisson;
    below 1 is burstier (the gaps' squared coefficient of variation is 1/burstiness), above 1
    more evenly spaced. The first gap is 0: the first request arrives at t = 0."""
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    if n:
        gaps[0] = 0.0
    return gaps


def tinyllm(num_seqs: int = 8, min_in: int = 64, max_in: int = 512, min_out: int = 32, max_out: int = 32,
            seed: int = 0, vocab: int = QWEN3_VOCAB) -> Trace:
    """The tiny-llm chunked-prefill benchmark trace: all requests arrive at t=0.

    Draw order per request (prompt length, output budget, then the prompt ids) follows the seed's
    benchmark, so seed 0 gives prompt lengths 496, 376, 510, 270, 181, 127, 342, 164.
    """
    _check_count("tinyllm trace", num_seqs, MAX_WITH_IDS)
    _check_range("prompt length", min_in, max_in)
    _check_range("output length", min_out, max_out)
    rng = random.Random(seed)
    reqs = []
    for i in range(num_seqs):
        n_in = rng.randint(min_in, max_in)
        n_out = rng.randint(min_out, max_out)
        ids = tuple(rng.randint(256, vocab - 1) for _ in range(n_in))
        reqs.append(Request(str(i), 0.0, n_in, n_out, ids))
    meta = {"source": "tinyllm", "num_seqs": num_seqs, "min_in": min_in, "max_in": max_in,
            "min_out": min_out, "max_out": max_out, "seed": seed, "vocab": vocab}
    return Trace(reqs, meta)


def fixed(arrivals: list[float], prompt_lens: list[int], output_lens: list[int], seed: int = 0,
          vocab: int = QWEN3_VOCAB, ids: list[str] | None = None, prefilled: list[str] = ()) -> Trace:
    """Explicit arrivals; requests named in `prefilled` start with their prefill already done."""
    if not (len(arrivals) == len(prompt_lens) == len(output_lens)):
        raise TraceError("fixed trace: arrivals, prompt lengths and output lengths differ in count")
    names = ids or [str(i) for i in range(len(arrivals))]
    rng = random.Random(seed)
    reqs = [Request(names[i], float(a), int(p), int(o), tuple(rng.randint(256, vocab - 1) for _ in range(int(p))),
                    prefilled=names[i] in prefilled)
            for i, (a, p, o) in enumerate(zip(arrivals, prompt_lens, output_lens))]
    reqs.sort(key=lambda r: r.arrival)
    meta = {"source": "fixed", "arrivals": list(arrivals), "prompt_lens": list(prompt_lens),
            "output_lens": list(output_lens), "seed": seed, "prefilled": list(prefilled)}
    return Trace(reqs, meta)


def metile_ab(prompt_len: int = 4096, output_len: int = 1024, seed: int = 0) -> Trace:
    """The meTile A/B experiment: at t=0 request A is already decoding and request B arrives.

    A's prefill and first token happen before the clock starts, so A has `output_len - 1` timed
    outputs and B has `output_len`, as in the seed (2,047 timed outputs for 1,024 each).
    """
    _check_range("prompt length", prompt_len, prompt_len)
    _check_range("output length", output_len, output_len)
    return fixed([0.0, 0.0], [prompt_len, prompt_len], [output_len, output_len], seed,
                 ids=["A", "B"], prefilled=["A"])


def poisson(num_requests: int = 100, rate: float = 1.0, min_in: int = 64, max_in: int = 512,
            min_out: int = 32, max_out: int = 128, seed: int = 0) -> Trace:
    """Poisson arrivals at `rate` requests/s with uniform lengths."""
    return gamma(num_requests, rate, 1.0, min_in, max_in, min_out, max_out, seed, source="poisson")


def gamma(num_requests: int = 100, rate: float = 1.0, burstiness: float = 1.0, min_in: int = 64,
          max_in: int = 512, min_out: int = 32, max_out: int = 128, seed: int = 0,
          source: str = "gamma") -> Trace:
    """Gamma inter-arrivals with mean 1/rate and shape `burstiness` (`gamma_gaps`: vLLM's convention)."""
    if not (math.isfinite(rate) and rate > 0):
        raise TraceError(f"{source} trace: rate must be a finite number > 0 requests/s, got {rate}")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise TraceError(f"{source} trace: burstiness must be a finite number > 0, got {burstiness}")
    _check_count(f"{source} trace", num_requests, MAX_REQUESTS)
    _check_range("prompt length", min_in, max_in)
    _check_range("output length", min_out, max_out)
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(gamma_gaps(rng, num_requests, rate, burstiness))
    p = rng.integers(min_in, max_in + 1, size=num_requests)
    o = rng.integers(min_out, max_out + 1, size=num_requests)
    reqs = [Request(str(i), float(arrivals[i]), int(p[i]), int(o[i])) for i in range(num_requests)]
    meta = {"source": source, "num_requests": num_requests, "rate": rate, "burstiness": burstiness,
            "min_in": min_in, "max_in": max_in, "min_out": min_out, "max_out": max_out, "seed": seed}
    return Trace(reqs, meta)


def bursty_classes(num_requests: int = 16, rate: float = 0.5, burstiness: float = 0.25, min_in: int = 16,
                   max_in: int = 256, min_out: int = 4, max_out: int = 16, tight_share: float = 0.5,
                   tight_max_in: int | None = None, seed: int = 0) -> Trace:
    """Two priority classes on bursty arrivals, for comparing queue orders (`queue=priority`).

    Gamma arrivals as `gamma` (default burstiness 1/4: CV^2 of the gaps 4, requests come in
    bursts); each request is of class `tight` with probability `tight_share` (short prompts,
    uniform in [min_in, tight_max_in]) or else `bulk` (long prompts, uniform in [tight_max_in,
    max_in]); outputs uniform in [min_out, max_out] for both. `tight_max_in` defaults to an eighth
    of the way from min_in to max_in. No class carries a TTFT target: give them with
    `--class-slo tight:ttft=MS` (a class without one has no deadline)."""
    if not (math.isfinite(tight_share) and 0 < tight_share < 1):
        raise TraceError(f"bursty-classes trace: tight share must be a fraction in (0, 1), got {tight_share}")
    if not (math.isfinite(rate) and rate > 0):
        raise TraceError(f"bursty-classes trace: rate must be a finite number > 0 requests/s, got {rate}")
    if not (math.isfinite(burstiness) and burstiness > 0):
        raise TraceError(f"bursty-classes trace: burstiness must be a finite number > 0, got {burstiness}")
    _check_count("bursty-classes trace", num_requests, MAX_REQUESTS)
    _check_range("prompt length", min_in, max_in)
    _check_range("output length", min_out, max_out)
    cut = min_in + (max_in - min_in) // 8 if tight_max_in is None else tight_max_in
    if not min_in <= cut <= max_in:
        raise TraceError(f"bursty-classes trace: tight prompts' maximum {cut} must lie in the prompt range "
                         f"{min_in}..{max_in}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(gamma_gaps(rng, num_requests, rate, burstiness))
    tight = rng.random(num_requests) < tight_share
    p = np.where(tight, rng.integers(min_in, cut + 1, size=num_requests), rng.integers(cut, max_in + 1, size=num_requests))
    o = rng.integers(min_out, max_out + 1, size=num_requests)
    reqs = [Request(str(i), float(arrivals[i]), int(p[i]), int(o[i]), cls="tight" if tight[i] else "bulk")
            for i in range(num_requests)]
    meta = {"source": "bursty-classes", "num_requests": num_requests, "rate": rate, "burstiness": burstiness,
            "min_in": min_in, "max_in": max_in, "min_out": min_out, "max_out": max_out, "tight_share": tight_share,
            "tight_max_in": cut, "seed": seed}
    return Trace(reqs, meta)


def _check_range(what: str, lo: int, hi: int) -> None:
    if lo < 1 or hi < lo:
        raise TraceError(f"{what} range {lo}..{hi} is empty or below 1")
    if hi > MAX_TOKENS:
        raise TraceError(f"{what} range {lo}..{hi}: at most {MAX_TOKENS:,} tokens (beyond any model's context)")


def _check_count(what: str, n: int, most: int) -> None:
    if not 1 <= n <= most:
        raise TraceError(f"{what}: the number of requests must be 1 to {most:,}, got {n}")


GENERATORS = {"tinyllm": tinyllm, "poisson": poisson, "gamma": gamma, "metile": metile_ab,
              "bursty-classes": bursty_classes}
