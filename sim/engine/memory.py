"""How much memory a setting needs at its peak: weights, the KV caches held, each call's temporaries.

On a Mac the KV cache and the weights share unified memory, so the peak of a run is a question a
user asks before the latency. The model prices a call's peak as what the engine holds when the
call starts, plus what the call allocates:

    peak(call) = weights + kv_bytes_per_token * (held + grown) + state_bytes * states + activations(call)

- `held`: token-rows of KV buffer resident before the call, by the buffers' capacities as
  `sim.engine.kvcache` follows them (mlx-lm grows caches in 256-token steps, so a request holding 300
  tokens holds a 512-token buffer); every request's own cache counts while it lives (the executor
  keeps it while the request decodes in the batch cache) and so does every batch cache;
- `grown`: token-rows the call adds to what is held (a buffer grown, a batch cache rebuilt
  larger), not the rows it copies: the calibration's grid measures memory in use rising by the
  growth (a chunk of 8 that grows a 256-row buffer to 506 rows: 62.5 MB, 250 rows and 4 MB of
  temporaries, where the 506 rows copied would be 116 MB), and counting the copies priced the
  activations at 0 and whole peaks 10-21% high; for mlx-lm's lazy rebuilds, whose held buffers
  already have their new sizes, the largest array the call builds (`sim.engine.state`);
- `states`: a hybrid model's linear-layer states alive at the call (`state_bytes_per_request`
  each, fixed whatever a request's length): every request holding a cache, and each row of a
  batch cache (pdsim's executor keeps a batched request's own cache beside its row); 0 for a dense model;
- `activations`: the call's temporaries, a form in its shape fitted to the calibration's measured
  peaks (`mx.get_peak_memory` above the memory active before the call):
  prefill of L tokens at offset P `a0 + a1*L + a2*L*(P + L) + a3*P` (hidden states and MLP rows per
  token, attention scores per query-key pair, a pass over the prefix); a decode of a batch of B
  rows `b0 + b1*B + b2*B*max(context)` (logits and MLP per row, scores per row and context token).

A run's peak is the largest call's. A profile without a `memory` section (calibrated before
this model) prices no memory: `peak_memory_gb` is then null.

The KV-cache limit a setting gives (`--kv-limit`) is in tokens (`4096`, `4096tok`) or in bytes of
cache (`2GB`, `0.5GB`, `1.5GiB`): GB are 10^9 bytes, GiB 2^30. A limit in bytes becomes tokens
through the model's bytes per KV token (`kv_bytes_per_token`), from the model the profile names
(the simulator) or the model it built (the real executor), so both executors enforce the same
number of tokens.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from sim.core.errors import InputError

GB = 1e9  # `peak_memory_gb` is in decimal gigabytes, as `mx.get_peak_memory` bytes / 1e9

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
UNITS = {"GB": 1e9, "GiB": float(1 << 30), "MB": 1e6, "MiB": float(1 << 20)}
MAX_TOKENS = 1 << 40  # beyond any device's memory: a typo

NO_MEMORY_NOTE = ("the profile has no memory model (calibrated before peak memory was measured): peak_memory_gb "
                  "is null; calibrate again to predict it")


def attention_layers(config: Mapping) -> int:
    """Layers that keep a KV cache: every layer of a dense model; of a hybrid (Qwen3.5, Qwen3-Next),
    one in `full_attention_interval` (mlx-lm's rule: layer i attends when (i + 1) % interval == 0),
    the others keeping a fixed-size state (`state_bytes_per_request`)."""
    layers, every = int(config["num_hidden_layers"]), config.get("full_attention_interval")
    return layers // int(every) if every else layers


def kv_bytes_per_token(config: Mapping, dtype: str | None = None) -> int:
    """Bytes one token of context takes in the KV cache (a token-row, as `sim.engine.kvcache` counts):
    attention layers x KV heads x head dim x 2 (keys and values) x the activations' bytes (mlx-lm's
    `KVCache` stores them in the model's dtype, quantized weights or not). `config`: the model's
    shapes; `dtype`: the model's (default: the config's `dtype`, else float32). Qwen3-0.6B:
    28 x 8 x 128 x 2 x 4 = 229,376 bytes in float32; Qwen3.5-0.8B: 6 x 2 x 256 x 2 x 4 = 24,576."""
    dtype = _dtype(config, dtype)
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return attention_layers(config) * int(heads) * int(head_dim) * 2 * DTYPE_BYTES[dtype]


def state_bytes_per_request(config: Mapping, dtype: str | None = None) -> int:
    """Bytes a request's linear-attention layers hold whatever its length (mlx-lm's `ArraysCache`:
    a conv state of kernel - 1 positions over the q, k and v channels in the model's dtype, and a
    recurrent state of value heads x value dim x key dim in float32); 0 for a dense model.
    Qwen3.5-0.8B in float32: 18 x (3 x 6,144 x 4 + 16 x 128 x 128 x 4) = 20.2 MB, the KV of 822 tokens."""
    linear = int(config["num_hidden_layers"]) - attention_layers(config)
    if not linear:
        return 0
    hk, hv = int(config["linear_num_key_heads"]), int(config["linear_num_value_heads"])
    dk, dv = int(config["linear_key_head_dim"]), int(config["linear_value_head_dim"])
    conv = (int(config["linear_conv_kernel_dim"]) - 1) * (2 * hk * dk + hv * dv) * DTYPE_BYTES[_dtype(config, dtype)]
    return linear * (conv + hv * dv * dk * 4)


def _dtype(config: Mapping, dtype: str | None) -> str:
    dtype = dtype or config.get("dtype") or "float32"
    if dtype not in DTYPE_BYTES:
        raise InputError(f"model dtype {dtype!r}: no KV bytes known for it (known: {', '.join(DTYPE_BYTES)})")
    return dtype


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
    state: float = 0.0  # bytes of a request's linear-layer state (a hybrid model's; 0: a dense model)

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

    def call_peak(self, held: int, grown: int, kind: str, tokens: int, prefix: int,
                  contexts: Sequence[int], states: int = 0) -> float:
        """Bytes in use at the peak of one call (see the module's formula)."""
        return (self.weights + self.kv_token * (held + grown) + self.state * states
                + self.activations(kind, tokens, prefix, contexts))

    def to_dict(self) -> dict:
        return {"weights_bytes": self.weights, "kv_bytes_per_token": self.kv_token,
                "prefill": list(self.prefill), "decode": list(self.decode)} \
            | ({"state_bytes_per_request": self.state} if self.state else {})


def memory_model(prof: dict) -> MemoryModel | None:
    """The profile's memory model, or None for a profile without one."""
    m = prof.get("memory")
    if not isinstance(m, dict) or m.get("prefill") is None:
        return None
    return MemoryModel(float(m["weights_bytes"]), float(m["kv_bytes_per_token"]),
                       tuple(float(x) for x in m["prefill"]), tuple(float(x) for x in m["decode"]),
                       float(m.get("state_bytes_per_request", 0.0)))


class PeakMemory:
    """The largest call peak of a run, tallied as calls come (`sim.engine.state.EngineState` feeds it)."""
    __slots__ = ("model", "peak", "at")

    def __init__(self, model: MemoryModel) -> None:
        self.model = model
        self.peak = 0.0
        self.at: tuple | None = None  # the call that set it: (kind, tokens, prefix, held, written)

    def call(self, held: int, grown: int, kind: str, tokens: int, prefix: int, contexts: Sequence[int],
             states: int = 0) -> None:
        b = self.model.call_peak(held, grown, kind, tokens, prefix, contexts, states)
        if b > self.peak:
            self.peak, self.at = b, (kind, tokens, prefix, held, grown)


def profile_kv_bytes(prof: Mapping) -> int | None:
    """Bytes per KV token of the model a profile names (its `model.shapes` and `model.dtype`); None
    when the profile does not record the model's shapes."""
    model = prof.get("model", {})
    shapes, dtype = model.get("shapes"), model.get("dtype") or "float32"
    if not isinstance(shapes, Mapping) or dtype not in DTYPE_BYTES:
        return None
    whole = lambda k: isinstance(shapes.get(k), int) and not isinstance(shapes.get(k), bool) and shapes[k] > 0
    if not all(whole(k) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size")) or \
            any(shapes.get(k) is not None and not whole(k) for k in ("num_key_value_heads", "head_dim")):
        return None  # not a model's shapes pdsim can read
    return kv_bytes_per_token(shapes, dtype)


def state_tokens(config: Mapping, dtype: str | None = None) -> int:
    """A request's linear-layer state (`state_bytes_per_request`) in KV tokens of memory, rounded up:
    what a KV limit counts for it beside its tokens (0 for a dense model). Qwen3.5-0.8B: 822."""
    state = state_bytes_per_request(config, dtype)
    return -(-state // kv_bytes_per_token(config, dtype)) if state else 0


def profile_state_tokens(prof: Mapping) -> int:
    """`state_tokens` of the model a profile names; 0 where its shapes are not a hybrid's (or not known)."""
    model = prof.get("model", {})
    shapes = model.get("shapes")
    if profile_kv_bytes(prof) is None or not isinstance(shapes.get("full_attention_interval"), int):
        return 0
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")
    if not all(isinstance(shapes.get(k), int) and shapes[k] > 0 for k in keys) or shapes["full_attention_interval"] < 1:
        return 0
    return state_tokens(shapes, model.get("dtype") or "float32")


DEVICE_SHARE = 0.9  # of MLX's memory limit, for weights and cache together (vLLM's gpu_memory_utilization default)


def device_kv_tokens(prof: Mapping) -> int | None:
    """Tokens of KV cache the profile's device holds: 0.9 of the engine's memory there (MLX's
    limit, or Metal's recommended working set where the device reports one: what the calibration
    records as `device.memory_limit_bytes`, `calibrate.host.machine.device_memory`) less
    the weights (the memory model's), over the model's bytes per KV token; the other tenth is left
    to each call's temporaries and the allocator. None where the profile lacks any of them (the
    built-in profile, and profiles from before): then no device limit."""
    limit, memory, per_token = prof.get("device", {}).get("memory_limit_bytes"), memory_model(prof), \
        profile_kv_bytes(prof)
    if limit is None or memory is None or not per_token:
        return None
    return max(0, int((DEVICE_SHARE * limit - memory.weights) // per_token))


@dataclass(frozen=True)
class KVLimit:
    """A KV-cache limit as given: `tokens`, or `amount` of `unit` (GB, GiB, MB, MiB) of cache."""
    tokens: int | None = None
    amount: float | None = None
    unit: str = "GB"

    def __str__(self) -> str:
        return f"{self.tokens}" if self.tokens is not None else f"{self.amount:g}{self.unit}"

    def resolve(self, bytes_per_token: int | None) -> int:
        """The limit in tokens (a byte limit needs the model's bytes per KV token)."""
        if self.tokens is not None:
            return self.tokens
        if not bytes_per_token:
            raise InputError(f"--kv-limit {self}: the model's bytes per KV token are unknown (the profile "
                             "records no model.shapes); give the limit in tokens")
        return int(self.amount * UNITS[self.unit] // bytes_per_token)


_LIMIT = re.compile(r"^\s*(?P<num>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(?P<unit>tok|tokens|GB|GiB|MB|MiB)?\s*$")


def parse_kv_limit(text) -> KVLimit | None:
    """`4096`, `4096tok`, `2GB`, `0.5GB`, `512MiB` -> a KVLimit; None, "" or "none" -> no limit.
    InputError naming the text for anything else (zero, negative, fractional tokens, other units)."""
    if text is None or isinstance(text, KVLimit):
        return text
    if hasattr(text, "item") and not isinstance(text, str):  # a numpy number, from a table row
        text = text.item()
    if isinstance(text, bool):
        raise InputError(f"kv limit {text!r}: expected tokens (4096, 4096tok) or an amount of memory (2GB, 0.5GB)")
    if isinstance(text, (int, float)):
        if isinstance(text, float) and math.isnan(text):
            return None
        text = f"{int(text)}" if float(text).is_integer() else repr(text)
    if text.strip().lower() in ("", "none"):
        return None
    m = _LIMIT.match(text)
    if not m and text.strip().startswith("-"):
        raise InputError(f"kv limit {text!r}: must be > 0")
    if not m:
        raise InputError(f"kv limit {text!r}: expected tokens (4096, 4096tok) or an amount of memory "
                         f"({', '.join('2' + u for u in UNITS)})")
    num, unit = m["num"], m["unit"] or "tok"
    if unit in ("tok", "tokens"):
        if not re.fullmatch(r"[0-9]+", num):
            raise InputError(f"kv limit {text!r}: tokens must be a whole number")
        tokens = int(num)
        if not 1 <= tokens <= MAX_TOKENS:
            raise InputError(f"kv limit {text!r}: must be between 1 and {MAX_TOKENS:,} tokens")
        return KVLimit(tokens=tokens)
    amount = float(num)
    if not (math.isfinite(amount) and amount > 0):
        raise InputError(f"kv limit {text!r}: must be a finite amount > 0")
    return KVLimit(amount=amount, unit=unit)
