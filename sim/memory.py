"""How much memory a setting needs at its peak: weights, the KV caches held, each call's temporaries.

On a Mac the KV cache and the weights share unified memory, so the peak of a run is a question a
user asks before the latency. The model prices a call's peak as what the engine holds when the
call starts, plus what the call allocates:

    peak(call) = weights + kv_bytes_per_token * (held + written) + activations(call)

- `held`: token-rows of KV buffer resident before the call, by the buffers' capacities as
  `sim.kvcache` follows them (mlx-lm grows caches in 256-token steps, so a request holding 300
  tokens holds a 512-token buffer); every request's own cache counts while it lives (the executor
  keeps it while the request decodes in the batch cache) and so does every batch cache;
- `written`: token-rows of the KV arrays the call allocates (growth, pad, concatenate, gather):
  the old buffer and the new one are both alive while the copy runs;
- `activations`: the call's temporaries, a form in its shape fitted to the calibration's measured
  peaks (`mx.get_peak_memory` above the memory active before the call):
  prefill of L tokens at offset P `a0 + a1*L + a2*L*(P + L) + a3*P` (hidden states and MLP rows per
  token, attention scores per query-key pair, a pass over the prefix); a decode of a batch of B
  rows `b0 + b1*B + b2*B*max(context)` (logits and MLP per row, scores per row and context token).

A run's peak is the largest call's. A profile without a `memory` section (calibrated before
this model) prices no memory: `peak_memory_gb` is then null.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

GB = 1e9  # `peak_memory_gb` is in decimal gigabytes, as `mx.get_peak_memory` bytes / 1e9

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

NO_MEMORY_NOTE = ("the profile has no memory model (calibrated before peak memory was measured): peak_memory_gb "
                  "is null; calibrate again to predict it")


def kv_bytes_per_token(config: dict) -> int:
    """Bytes of one token-row of KV cache: keys and values of every layer (`sim.kvcache` counts
    token-rows). `config`: the model's shapes (`num_hidden_layers`, `num_key_value_heads`,
    `head_dim`, or `hidden_size` / `num_attention_heads`), with its `dtype` (default float32; the
    caches hold activations, unquantized, whatever the weights' bits)."""
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype = config.get("dtype") or "float32"
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return 2 * config["num_hidden_layers"] * heads * head_dim * DTYPE_BYTES[dtype]


def prefill_features(tokens: int, prefix: int) -> tuple[float, float, float, float]:
    """The prefill activation form's terms for a chunk of `tokens` at cache offset `prefix`."""
    return 1.0, float(tokens), float(tokens) * (prefix + tokens), float(prefix)


def decode_features(rows: int, longest: int) -> tuple[float, float, float]:
    """The decode activation form's terms for a batch of `rows` whose longest context is `longest`."""
    return 1.0, float(rows), float(rows) * longest


@dataclass(frozen=True)
class MemoryModel:
    """A profile's `memory` section: bytes of the weights and of a KV token-row, and the fitted
    activation coefficients (bytes)."""
    weights: float
    kv_token: float
    prefill: tuple[float, float, float, float]
    decode: tuple[float, float, float]

    def activations(self, kind: str, tokens: int, prefix: int, contexts: Sequence[int]) -> float:
        """A call's temporaries. mlx-lm's prompt calls (rows of `tokens` each at write position
        `prefix`) are priced as one chunk of all rows' tokens; its first forwards and steps as decodes."""
        if kind == "prefill":
            f = prefill_features(tokens, prefix)
            return sum(c * x for c, x in zip(self.prefill, f))
        if kind == "prompt":
            rows = max(1, len(contexts))
            _, a1, a2, a3 = self.prefill
            return self.prefill[0] + rows * (a1 * tokens + a2 * tokens * (prefix + tokens) + a3 * prefix)
        if kind == "sync":
            return 0.0
        f = decode_features(len(contexts), max(contexts) if contexts else 0)
        return sum(c * x for c, x in zip(self.decode, f))

    def call_peak(self, held: int, written: int, kind: str, tokens: int, prefix: int,
                  contexts: Sequence[int]) -> float:
        """Bytes in use at the peak of one call (see the module's formula)."""
        return self.weights + self.kv_token * (held + written) + self.activations(kind, tokens, prefix, contexts)

    def to_dict(self) -> dict:
        return {"weights_bytes": self.weights, "kv_bytes_per_token": self.kv_token,
                "prefill": list(self.prefill), "decode": list(self.decode)}


def memory_model(prof: dict) -> MemoryModel | None:
    """The profile's memory model, or None for a profile without one."""
    m = prof.get("memory")
    if not isinstance(m, dict) or m.get("prefill") is None:
        return None
    return MemoryModel(float(m["weights_bytes"]), float(m["kv_bytes_per_token"]),
                       tuple(float(x) for x in m["prefill"]), tuple(float(x) for x in m["decode"]))


class PeakMemory:
    """The largest call peak of a run, tallied as calls come (`sim.state.EngineState` feeds it)."""
    __slots__ = ("model", "peak", "at")

    def __init__(self, model: MemoryModel) -> None:
        self.model = model
        self.peak = 0.0
        self.at: tuple | None = None  # the call that set it: (kind, tokens, prefix, held, written)

    def call(self, held: int, written: int, kind: str, tokens: int, prefix: int, contexts: Sequence[int]) -> None:
        b = self.model.call_peak(held, written, kind, tokens, prefix, contexts)
        if b > self.peak:
            self.peak, self.at = b, (kind, tokens, prefix, held, written)
